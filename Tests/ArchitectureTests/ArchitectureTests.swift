import Foundation
import Testing

/// docs/ARCHITECTURE.md's table of modules, Package.swift and the imports in Sources/ must
/// say the same thing, and the graph must keep the rules the page states.
@Suite("Architecture: the page, the package and the imports agree")
struct ArchitectureTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    struct Module: Equatable {
        var folder: String
        var imports: Set<String>
    }

    /// The table under "## Modules and their arrows".
    static func page() throws -> [String: Module] {
        let text = try String(contentsOf: root.appendingPathComponent("docs/ARCHITECTURE.md"), encoding: .utf8)
        let after = try #require(text.components(separatedBy: "## Modules and their arrows").dropFirst().first)
        let section = after.components(separatedBy: "\n## ").first ?? after
        var modules: [String: Module] = [:]
        for line in section.components(separatedBy: "\n") where line.hasPrefix("| `") {
            let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count == 3 else { continue }
            let imports = cells[2] == "-" ? [] : Set(cells[2].components(separatedBy: ", "))
            modules[cells[0].trimmingCharacters(in: CharacterSet(charactersIn: "`"))] = Module(folder: cells[1], imports: imports)
        }
        return modules
    }

    /// Every non-test target of Package.swift: its folder under Sources/ and its dependencies
    /// on other targets.
    static func package() throws -> [String: (path: String, dependencies: Set<String>)] {
        let text = try String(contentsOf: root.appendingPathComponent("Package.swift"), encoding: .utf8)
        var targets: [String: (String, Set<String>)] = [:]
        let declarations = text.components(separatedBy: "\n        .").dropFirst()
        let kinds = ["target(", "executableTarget(", "systemLibrary("]
        for declaration in declarations where kinds.contains(where: declaration.hasPrefix) {
            let name = try #require(declaration.firstMatch(of: /name: "([^"]+)"/)?.1).description
            let path = try #require(declaration.firstMatch(of: /path: "([^"]+)"/)?.1, "\(name) has no path").description
            var dependencies: Set<String> = []
            if let list = declaration.firstMatch(of: /dependencies: \[([^\]]*)\]/)?.1 {
                // Quoted names outside `.product(...)`: the package's own targets.
                let withoutProducts = list.replacing(/\.product\([^)]*\)/, with: "")
                for match in withoutProducts.matches(of: /"([^"]+)"/) { dependencies.insert(String(match.1)) }
            }
            targets[name] = (path, dependencies)
        }
        return targets
    }

    /// The modules the Swift files under `path` import.
    static func imports(under path: String) throws -> Set<String> {
        var found: Set<String> = []
        let folder = root.appendingPathComponent(path)
        let files = try #require(FileManager.default.enumerator(at: folder, includingPropertiesForKeys: nil))
        for case let file as URL in files where file.pathExtension == "swift" {
            for line in try String(contentsOf: file, encoding: .utf8).split(separator: "\n") {
                // The plain test first: the pattern is slow in a debug build, and few lines import.
                if line.contains("import "), let match = line.firstMatch(of: /^\s*(?:@_exported\s+|@testable\s+)?(?:public\s+|internal\s+|package\s+)?import\s+(\w+)/) {
                    found.insert(String(match.1))
                }
            }
        }
        return found
    }

    @Test("every target is on the page, in the folder it names, with the same arrows as Package.swift and its imports")
    func arrowsAgree() throws {
        let page = try Self.page()
        let package = try Self.package()
        #expect(Set(page.keys) == Set(package.keys), "targets on the page and in Package.swift differ")
        for (name, target) in package.sorted(by: { $0.key < $1.key }) {
            guard let module = page[name] else { continue }
            #expect(target.path.hasPrefix("Sources/\(module.folder)/"), "\(name) is in \(target.path), the page says Sources/\(module.folder)")
            #expect(target.dependencies.subtracting([name]) == module.imports,
                    "\(name): Package.swift depends on \(target.dependencies.sorted()), the page says \(module.imports.sorted())")
            let imported = try Self.imports(under: target.path).intersection(package.keys)
            #expect(imported == module.imports, "\(name) imports \(imported.sorted()), the page says \(module.imports.sorted())")
        }
    }

    @Test("a module imports only from its own folder or those above it; nothing imports the tools")
    func layers() throws {
        let order = ["Bus", "Services", "Operations", "Programs", "Tools"]
        let page = try Self.page()
        for (name, module) in page {
            let level = try #require(order.firstIndex(of: module.folder), "\(name): unknown folder \(module.folder)")
            for dependency in module.imports {
                let theirs = try #require(page[dependency].flatMap { order.firstIndex(of: $0.folder) })
                #expect(theirs <= level, "\(name) (\(module.folder)) imports \(dependency) (\(order[theirs]))")
                if module.folder != "Tools" { #expect(order[theirs] != "Tools", "\(name) imports the tool \(dependency)") }
            }
        }
    }

    @Test("the configuration module knows no module; the gateway does not reach the kernel; sb reaches no service; services do not import each other")
    func rules() throws {
        let page = try Self.page()
        func reach(_ name: String) -> Set<String> {
            var seen: Set<String> = [], queue = [name]
            while let next = queue.popLast() {
                for dependency in page[next]?.imports ?? [] where seen.insert(dependency).inserted { queue.append(dependency) }
            }
            return seen
        }
        #expect(page["SwitchboardConfig"]?.imports == [])
        #expect(!reach("Gateway").contains("Kernel"))
        let services: Set = ["EchoService", "FetcherService", "StoreService", "StreamsService", "SearchService", "PricingService"]
        #expect(reach("sb").isDisjoint(with: services.union(["Kernel"])))
        for service in services { #expect(reach(service).isDisjoint(with: services), "\(service) imports another service") }
    }

    @Test("an unstructured task starts only where the page's table of task sites names the file")
    func taskSites() throws {
        let text = try String(contentsOf: Self.root.appendingPathComponent("docs/ARCHITECTURE.md"), encoding: .utf8)
        let after = try #require(text.components(separatedBy: "## Where tasks start").dropFirst().first)
        let section = after.components(separatedBy: "\n## ").first ?? after
        let named = Set(section.matches(of: /\| `([A-Za-z]+\/[A-Za-z]+\.swift)` \|/).map { String($0.1) })
        for (path, text) in try Self.productionSources() {
            let starts = text.split(separator: "\n").filter { line in
                !line.trimmingCharacters(in: .whitespaces).hasPrefix("//")
                    && line.contains("Task") && (line.contains(/(^|[^A-Za-z.])Task \{/) || line.contains("Task.detached") || line.contains(/(^|[^A-Za-z.])Task\(/))
            }
            // As the page names it: the module's folder and the file.
            let name = path.split(separator: "/").suffix(2).joined(separator: "/")
            #expect(starts.isEmpty || named.contains(name), "\(name) starts a task the page does not name: \(starts.first ?? "")")
        }
    }

    /// Places where the code switches Swift's run-time exclusivity checks off, by file, with
    /// the measured reason each must stay. Empty: what the checks cost the kernel
    /// (docs/PERFORMANCE.md) is to go by keeping its per-message state in value types, which
    /// are checked when compiled, not by switching checks off. The count only goes down.
    static let uncheckedExclusivity: [String: (count: Int, reason: String)] = [:]

    /// The Swift files under the library and program folders (not the tools), with their text.
    static func productionSources() throws -> [(name: String, text: String)] {
        var sources: [(String, String)] = []
        for folder in ["Bus", "Services", "Operations", "Programs"] {
            let base = root.appendingPathComponent("Sources/\(folder)")
            let files = try #require(FileManager.default.enumerator(at: base, includingPropertiesForKeys: nil))
            for case let file as URL in files where file.pathExtension == "swift" {
                let name = String(file.path.dropFirst(root.path.count + 1))
                sources.append((name, try String(contentsOf: file, encoding: .utf8)))
            }
        }
        return sources
    }

    @Test("the libraries keep Swift's run-time exclusivity checks, but for the allowlist's places")
    func exclusivityChecked() throws {
        for (name, text) in try Self.productionSources() {
            let count = text.contains("@exclusivity") ? text.matches(of: /@exclusivity\(unchecked\)/).count : 0
            #expect(count <= (Self.uncheckedExclusivity[name]?.count ?? 0),
                    "\(name) switches exclusivity checks off \(count) times; the allowlist in ArchitectureTests names its reason, or it goes")
        }
    }

    /// The test files that poll (with `eventually`), with what they wait for. A test awaits the
    /// event it waits for (the test support's `awaitState`, `TestKernel.workers` and
    /// `offers`, `TestEtcd.values`, `Observed`); it polls only what another process does, or
    /// what the code under test tells no one. The counts only go down.
    static let polls: [String: (count: Int, waitsFor: String)] = [
        "Tests/BusKitTests/BusKitTests.swift": (4, "a client's requests waiting, a kernel's queue, a worker process's request"),
        "Tests/BusKitTests/CellTests.swift": (2, "the stop reaching another cell's worker, a gateway process"),
        "Tests/BusKitTests/CurveTests.swift": (3, "the kernel's security counters"),
        "Tests/BusKitTests/KernelPairTests.swift": (4, "the pair's roles, a subscription's connections"),
        "Tests/BusKitTests/PartStreamTests.swift": (2, "a stream ended unread, a client's requests waiting"),
        "Tests/BusKitTests/StatsTests.swift": (1, "error counts that come with the workers' heartbeats"),
        "Tests/DeploymentTests/CellPartitionTests.swift": (1, "kernel processes on other hosts"),
        "Tests/DeploymentTests/GatewayFailoverTests.swift": (5, "gateway processes and HAProxy"),
        "Tests/DeploymentTests/HostileClientTests.swift": (2, "a kernel process"),
        "Tests/DeploymentTests/InterruptedSoakTests.swift": (1, "the soak's processes ending"),
        "Tests/DeploymentTests/PairSplitTests.swift": (3, "kernel processes in network namespaces"),
        "Tests/DeploymentTests/RollingRestartTests.swift": (1, "sb processes' load"),
        "Tests/DeploymentTests/UpTests.swift": (1, "processes ending"),
        "Tests/FetcherServiceTests/FetcherTests.swift": (1, "the HTTP server process"),
        "Tests/FetcherServiceTests/OfflineTests.swift": (1, "a fetcher process"),
        "Tests/StoreServiceTests/PostgresFaultTests.swift": (1, "PostgreSQL back"),
        "Tests/StreamsServiceTests/StreamsTests.swift": (1, "an sb process's request reaching the streams worker"),
    ]

    @Test("tests await events; they poll only where the allowlist says what for")
    func testsAwaitEvents() throws {
        let base = Self.root.appendingPathComponent("Tests")
        let files = try #require(FileManager.default.enumerator(at: base, includingPropertiesForKeys: nil))
        for case let file as URL in files where file.pathExtension == "swift" {
            let name = String(file.path.dropFirst(Self.root.path.count + 1))
            let count = try String(contentsOf: file, encoding: .utf8).matches(of: /eventually\(/).count
            #expect(count <= (Self.polls[name]?.count ?? 0),
                    "\(name) polls \(count) times: await the event instead (docs/ARCHITECTURE.md, SwitchboardTestSupport), or say in ArchitectureTests.polls what it waits for")
        }
    }

    @Test("every test is swift-testing's: Scripts/test runs the test binary for swift-testing alone, where an XCTest case would never run")
    func testsAreSwiftTesting() throws {
        #expect(try !Self.imports(under: "Tests").contains("XCTest"), "a test imports XCTest: write it with swift-testing (import Testing)")
    }

    @Test("code comments state rules, not history: none cites an issue or the benchmark notes")
    func commentsCiteNoIssues() throws {
        for (name, text) in try Self.productionSources() {
            for line in text.split(separator: "\n") where line.contains("//") {
                let comment = line[line.range(of: "//")!.lowerBound...]
                #expect(!(comment.contains("ssue") || comment.contains("BENCHMARKS")) || !comment.contains(/[Ii]ssue #?[0-9]+|BENCHMARKS\.md/), "\(name): \(comment)")
            }
        }
    }
}
