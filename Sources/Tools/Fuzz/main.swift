// switchboard-fuzz: coverage-guided fuzzing of the decoders of untrusted input (see
// docs/FUZZING.md). Built with libFuzzer (-sanitize=fuzzer -DFUZZING) it fuzzes; built
// normally it runs the given files once each, to replay a crash.
//
//   switchboard-fuzz --target=mdp Fuzz/corpus/mdp -runs=1000000
//
// libFuzzer leaves flags that start with "--" to the program: --target picks the decoder.
import Foundation
import FuzzTargets
#if FUZZING
import CLibFuzzer
#endif

let arguments = CommandLine.arguments
guard let name = arguments.first(where: { $0.hasPrefix("--target=") })?.dropFirst("--target=".count),
      let target = FuzzTarget(rawValue: String(name)) else {
    let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")
    FileHandle.standardError.write(Data("usage: switchboard-fuzz --target=NAME [corpus folders or files] [libFuzzer flags]\n  targets: \(names)\n".utf8))
    exit(64)
}

if let folder = arguments.first(where: { $0.hasPrefix("--write-seeds=") })?.dropFirst("--write-seeds=".count) {
    let url = URL(fileURLWithPath: String(folder))
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    for (index, seed) in target.seeds.enumerated() {
        try Data(seed).write(to: url.appendingPathComponent(String(format: "seed-%02d", index)))
    }
    print("switchboard-fuzz: \(target.seeds.count) seeds for \(target.rawValue) in \(url.path)")
    exit(0)
}

#if FUZZING
nonisolated(unsafe) var fuzzTarget = target
var argc = CommandLine.argc
var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
exit(LLVMFuzzerRunDriver(&argc, &argv) { data, size in
    fuzzTarget.run(size == 0 ? [] : Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
})
#else
// Replay: every file given, or every file in the folders given.
var inputs: [URL] = []
for path in arguments.dropFirst() where !path.hasPrefix("-") {
    let url = URL(fileURLWithPath: path)
    if let names = try? FileManager.default.contentsOfDirectory(atPath: path) {
        inputs += names.sorted().map { url.appendingPathComponent($0) }
    } else {
        inputs.append(url)
    }
}
for input in inputs {
    target.run(Array(try Data(contentsOf: input)))
}
print("switchboard-fuzz: \(inputs.count) inputs through \(target.rawValue), no crash (replay build; fuzz with docs/FUZZING.md's command)")
#endif
