import Foundation
import SwitchboardTestSupport
import Testing

@Suite("Man pages")
struct ManPageTests {
    @Test("docs/man/switchboard.1 and sb.1 are what the argument parsers say now (regenerate: Scripts/man)")
    func manPagesMatchTheParsers() async throws {
        let products = switchboardExecutable().deletingLastPathComponent()
        let generator = products.appendingPathComponent("generate-manual")
        try #require(FileManager.default.isExecutableFile(atPath: generator.path),
                     "no \(generator.path): build it with swift build --product generate-manual (Scripts/test does)")
        let pages = Self.repository.appendingPathComponent("docs/man")
        let folder = try temporaryDirectory("man")
        defer { try? FileManager.default.removeItem(at: folder) }
        for tool in ["switchboard", "sb"] {
            let committed = try String(contentsOf: pages.appendingPathComponent("\(tool).1"), encoding: .utf8)
            // Generated with the committed page's date, so only a change of the parser shows.
            let dated = try #require(committed.split(separator: "\n").first { $0.hasPrefix(".Dd ") }.map { String($0.dropFirst(4)) })
            let date = try #require(Self.isoDate(dated), "the page's date \(dated)")
            let generated = try await runCommand(generator, [products.appendingPathComponent(tool).path, "--date", date, "--output-directory", folder.path])
            #expect(generated.status == 0, "\(generated)")
            // Tidied as Scripts/man writes it, by the same script.
            let raw = try Data(contentsOf: folder.appendingPathComponent("\(tool).1"))
            let tidied = try await runCommand(Self.repository.appendingPathComponent("Scripts/man"), ["--tidy"], input: raw)
            #expect(tidied.status == 0, "\(tidied)")
            #expect(tidied.stdout == committed, "docs/man/\(tool).1 differs from \(tool)'s argument parser: regenerate it with Scripts/man")
        }
    }

    @Test("mandoc -T lint finds nothing to warn of in docs/man (the test command's bootstrap installs mandoc)")
    func mandocLint() async throws {
        let mandoc = URL(fileURLWithPath: "/usr/bin/mandoc")
        try #require(FileManager.default.isExecutableFile(atPath: mandoc.path), "no mandoc: Scripts/bootstrap --tests installs it")
        let pages = ["switchboard.1", "sb.1"].map { Self.repository.appendingPathComponent("docs/man/\($0)").path }
        let lint = try await runCommand(mandoc, ["-T", "lint", "-W", "warning"] + pages)
        #expect(lint.status == 0 && lint.stdout.isEmpty && lint.stderr.isEmpty, "\(lint)")
    }

    @Test("man shows every row of examples on one line, however deep its command (a literal display, not filled text)")
    func examplesUnwrapped() async throws {
        let mandoc = URL(fileURLWithPath: "/usr/bin/mandoc")
        try #require(FileManager.default.isExecutableFile(atPath: mandoc.path), "no mandoc: Scripts/bootstrap --tests installs it")
        for page in ["switchboard.1", "sb.1"] {
            let path = Self.repository.appendingPathComponent("docs/man/\(page)").path
            let rows = try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n").filter { $0.hasPrefix(" ") }
            let shown = try await runCommand(mandoc, ["-T", "ascii", "-O", "width=80", path])
            #expect(shown.status == 0, "\(shown)")
            let lines = Set(shown.stdout.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) })
            // `\e` is how a page writes a backslash.
            let wrapped = rows.map { $0.replacingOccurrences(of: "\\e", with: "\\").trimmingCharacters(in: .whitespaces) }.filter { !lines.contains($0) }
            #expect(!rows.isEmpty && wrapped.isEmpty, "\(page): rows man wraps: \(wrapped)")
        }
    }

    @Test("every command's --help reads at 80 columns: no line wider, no sentence broken by a hard line end, no example row wrapped")
    func helpFitsATerminal() async throws {
        var problems: [String] = []
        // Each command, then each of its subcommands, as the SUBCOMMANDS section lists them.
        var commands = [(sbExecutable(), [String]()), (switchboardExecutable(), [String]())]
        while let (tool, path) = commands.popLast() {
            let help = try await runCommand(tool, path + ["--help"])
            let name = ([tool.lastPathComponent] + path).joined(separator: " ")
            #expect(help.status == 0, "\(name) --help: \(help)")
            let lines = help.stdout.split(separator: "\n", omittingEmptySubsequences: false)
            // What the command says of itself, before the usage line (which lists the flags on one line).
            let text = lines.prefix { !$0.hasPrefix("USAGE:") }
            for (previous, line) in zip([""] + text, text) {
                if line.count > 80 { problems.append("\(name): wider than 80 columns: \(line)") }
                // A row of examples or a table wider than the terminal, wrapped to column 0.
                if previous.hasPrefix("  "), let first = line.first, first.isLowercase {
                    problems.append("\(name): a row wrapped: \(previous) / \(line)")
                }
                // A paragraph with a hard line end of its own, which the parser wraps again.
                if !previous.isEmpty, !previous.hasPrefix(" "), previous.count < 60, let first = line.first, first.isLowercase {
                    problems.append("\(name): a sentence broken: \(previous) / \(line)")
                }
            }
            let subcommands = lines.drop { $0 != "SUBCOMMANDS:" }.dropFirst().prefix { !$0.isEmpty }
            for row in subcommands where row.hasPrefix("  ") && !row.hasPrefix("   ") {
                // "del, rm": a name and its aliases.
                guard let subcommand = row.split(separator: " ").first?.split(separator: ",").first, subcommand != "help" else { continue }
                commands.append((tool, path + [String(subcommand)]))
            }
        }
        #expect(problems.isEmpty, "\(problems.joined(separator: "\n"))")
    }

    static let repository = repositoryRoot()

    /// "November 25, 2026" (how the page says it) as 2026-11-25 (how the generator takes it).
    static func isoDate(_ text: String) -> String? {
        let reading = DateFormatter()
        reading.locale = Locale(identifier: "en_US_POSIX")
        reading.timeZone = TimeZone(identifier: "UTC")
        reading.dateFormat = "MMMM d, yyyy"
        guard let date = reading.date(from: text) else { return nil }
        let writing = DateFormatter()
        writing.locale = reading.locale
        writing.timeZone = reading.timeZone
        writing.dateFormat = "yyyy-MM-dd"
        return writing.string(from: date)
    }
}
