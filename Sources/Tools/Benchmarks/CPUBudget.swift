import ArgumentParser
import Foundation

/// A share of one CPU for a group of processes: a control group with a CPU quota, confined to
/// that CPU. cgroup v2 (`cpu.max`, `cpuset.cpus`) where its controllers are on, else v1's `cpu`
/// and `cpuset` hierarchies. Needs root. A process moved in takes its threads with it, and the
/// threads it starts later are born there.
struct CPUBudget {
    /// The groups' folders, each with its `cgroup.procs`.
    private let folders: [String]

    /// Why a budget cannot be made on this machine, or nil when it can.
    static var unavailable: String? {
        guard getuid() == 0 else { return "needs root (it makes control groups)" }
        if version2 { return nil }
        let v1 = ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuset"]
        guard v1.allSatisfy({ access($0, W_OK) == 0 }) else {
            return "neither cgroup v2 with its cpu and cpuset controllers nor a writable cgroup v1 cpu and cpuset"
        }
        return nil
    }

    private static let v2Root = "/sys/fs/cgroup"
    private static var version2: Bool {
        let controllers = (try? String(contentsOfFile: v2Root + "/cgroup.controllers", encoding: .utf8)) ?? ""
        let names = controllers.split(whereSeparator: \.isWhitespace)
        return names.contains("cpu") && names.contains("cpuset")
    }

    /// A group named `name` that may use `cores` (a fraction: 0.5 is half of one) of CPU `cpu`.
    init(name: String, cpu: Int, cores: Double) throws {
        let quota = String(Int(cores * 100_000))
        var made: [String] = []
        func makeFolder(_ path: String) throws {
            guard mkdir(path, 0o755) == 0 || errno == EEXIST else {
                throw ValidationError("cannot make the control group \(path): \(String(cString: strerror(errno)))")
            }
            made.append(path)
        }
        do {
            if Self.version2 {
                // A child's controllers must be enabled in its parent first.
                try Self.write("+cpu +cpuset", to: Self.v2Root + "/cgroup.subtree_control")
                let folder = Self.v2Root + "/" + name
                try makeFolder(folder)
                try Self.write("\(quota) 100000", to: folder + "/cpu.max")
                try Self.write(String(cpu), to: folder + "/cpuset.cpus")
            } else {
                let cpuFolder = "/sys/fs/cgroup/cpu/" + name, cpusetFolder = "/sys/fs/cgroup/cpuset/" + name
                try makeFolder(cpuFolder)
                try Self.write("100000", to: cpuFolder + "/cpu.cfs_period_us")
                try Self.write(quota, to: cpuFolder + "/cpu.cfs_quota_us")
                try makeFolder(cpusetFolder)
                // A v1 cpuset takes no process until both its CPUs and its memory nodes are set.
                let memoryNodes = try String(contentsOfFile: "/sys/fs/cgroup/cpuset/cpuset.mems", encoding: .utf8)
                try Self.write(memoryNodes.trimmingCharacters(in: .whitespacesAndNewlines), to: cpusetFolder + "/cpuset.mems")
                try Self.write(String(cpu), to: cpusetFolder + "/cpuset.cpus")
            }
        } catch {
            // Half made: nothing left behind.
            for folder in made { rmdir(folder) }
            throw error
        }
        folders = made
    }

    /// Moves the process `pid`, all its threads, into the group.
    func add(_ pid: Int32) throws {
        for folder in folders { try Self.write(String(pid), to: folder + "/cgroup.procs") }
    }

    /// Removes the groups; their processes must have ended (a group with a process stays).
    func remove() {
        for folder in folders { rmdir(folder) }
    }

    private static func write(_ value: String, to path: String) throws {
        do {
            try value.write(toFile: path, atomically: false, encoding: .utf8)
        } catch {
            throw ValidationError("cannot write '\(value)' to \(path): \(error)")
        }
    }
}
