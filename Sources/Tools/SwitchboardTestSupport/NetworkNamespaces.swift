public import Foundation

/// Network namespaces (`ip netns`) as hosts, for tests and benchmarks of several machines on
/// one: made and removed by whoever uses them. Needs root and iproute2.
public enum NetworkNamespaces {
    /// Whether this machine lets us make network namespaces (root, iproute2, a kernel with netns).
    public static let available: Bool = {
        let probe = "sb-probe-\(getpid())"
        guard (try? ip(["netns", "add", probe])) != nil else { return false }
        _ = try? ip(["netns", "del", probe])
        return true
    }()

    /// Runs `ip ARGUMENTS`; its error output in the error when it fails.
    public static func ip(_ arguments: [String]) throws {
        try runTool("ip", arguments)
    }

    /// Runs `tc ARGUMENTS` (traffic control: a link's rate, delay, loss) the same way.
    public static func tc(_ arguments: [String]) throws {
        try runTool("tc", arguments)
    }

    /// A cable between two hosts: a veth pair `device` and `peer`, in the namespace that
    /// runs this (move each end to its host). Both ends send one TCP segment a packet, as a
    /// network's wire does (no segmentation offload): a slowed link (``limit(_:on:in:rate:)``,
    /// tbf) sends a packet whole, and a 64 kB offloaded one would arrive at once after seconds
    /// of nothing, where a slow link delivers its bytes as they cross; TCP then takes the
    /// queue for a loss and sends again what is still on its way. It is set here, not when a
    /// link is slowed, because a connection keeps the packet size its device had when it was
    /// made.
    public static func addLink(_ device: String, peer: String) throws {
        try ip(["link", "add", device, "gso_max_segs", "1", "type", "veth", "peer", "name", peer, "gso_max_segs", "1"])
    }

    /// Sends what `device` in namespace `host` sends and `selectors` match (tc's u32
    /// selectors, such as `["match", "ip", "dport", "5560", "0xffff"]`) at `rate` at most, in
    /// a class of its own: the rest goes unslowed and never queues behind it (acknowledgements
    /// of other connections among it, as with fair queueing). Undone by deleting the
    /// device's root qdisc. `device` is one end of an ``addLink(_:peer:)``.
    public static func limit(_ selectors: [String], on device: String, in host: String, rate: String) throws {
        let (namespace, dev) = (["-n", host], ["dev", device])
        try tc(namespace + ["qdisc", "add"] + dev + ["root", "handle", "1:", "htb", "default", "10"])
        try tc(namespace + ["class", "add"] + dev + ["parent", "1:", "classid", "1:10", "htb", "rate", "10gbit", "quantum", "60000"])
        try tc(namespace + ["class", "add"] + dev + ["parent", "1:", "classid", "1:20", "htb", "rate", rate])
        try tc(namespace + ["filter", "add"] + dev + ["parent", "1:", "protocol", "ip", "prio", "1", "u32"] + selectors + ["flowid", "1:20"])
    }

    private static func runTool(_ tool: String, _ arguments: [String]) throws {
        let (status, errors) = try runBriefly(env.path, [tool] + arguments)
        guard status == 0 else { throw NetworkNamespaceError(description: "\(tool) \(arguments.joined(separator: " ")): \(errors)") }
    }

    /// `ip netns exec HOST executable arguments...` as a child process, with the program's
    /// own pid (`ip` execs it); `watched` for a program that watches no lifeline itself
    /// (``ChildProcess/init(watched:_:)``).
    public static func start(in host: String, _ executable: URL, _ arguments: [String], watched: Bool = false) throws -> ChildProcess {
        watched ? try ChildProcess(watched: env, exec(in: host, executable) + arguments) : try ChildProcess(env, exec(in: host, executable) + arguments)
    }

    /// The same, run to its end (killed after `seconds`).
    public static func run(in host: String, _ executable: URL, _ arguments: [String], environment: [String: String] = [:],
                           seconds: Double = 30) async throws -> CommandResult {
        try await runCommand(env, exec(in: host, executable) + arguments, environment: environment, seconds: seconds)
    }

    private static let env = URL(fileURLWithPath: "/usr/bin/env")
    private static func exec(in host: String, _ executable: URL) -> [String] { ["ip", "netns", "exec", host, executable.path] }
}

public struct NetworkNamespaceError: Error, CustomStringConvertible {
    public let description: String
}

/// Hosts on one switch: a network namespace each, joined by a veth pair to a bridge in a
/// namespace of its own, so a host is cut off from all the others by taking its port on the
/// bridge down, as a cable pulled at the switch.
public struct SwitchedHosts: Sendable {
    /// Each host's namespace, and its address on the switch.
    public let hosts: [String]
    public let addresses: [String]
    public let switchHost: String
    /// Each host's port on the bridge (in the switch's namespace).
    public let ports: [String]

    public static func make(count: Int) throws -> SwitchedHosts {
        let tag = String(UInt32.random(in: 0..<UInt32.max), radix: 36)
        let subnet = "10.\(Int.random(in: 200...250)).\(Int.random(in: 1...250))"
        let hosts = SwitchedHosts(hosts: (0..<count).map { "sbh\($0)-\(tag)" }, addresses: (0..<count).map { "\(subnet).\($0 + 1)" },
                                  switchHost: "sbsw-\(tag)", ports: (0..<count).map { "sp\($0)-\(tag)" })
        do {
            try NetworkNamespaces.ip(["netns", "add", hosts.switchHost])
            try NetworkNamespaces.ip(["-n", hosts.switchHost, "link", "add", "br0", "type", "bridge"])
            try NetworkNamespaces.ip(["-n", hosts.switchHost, "link", "set", "br0", "up"])
            for (index, host) in hosts.hosts.enumerated() {
                let device = "sh\(index)-\(tag)"
                try NetworkNamespaces.ip(["netns", "add", host])
                try NetworkNamespaces.addLink(device, peer: hosts.ports[index])
                try NetworkNamespaces.ip(["link", "set", device, "netns", host])
                try NetworkNamespaces.ip(["link", "set", hosts.ports[index], "netns", hosts.switchHost])
                try NetworkNamespaces.ip(["-n", hosts.switchHost, "link", "set", hosts.ports[index], "master", "br0"])
                try NetworkNamespaces.ip(["-n", hosts.switchHost, "link", "set", hosts.ports[index], "up"])
                try NetworkNamespaces.ip(["-n", host, "addr", "add", "\(hosts.addresses[index])/24", "dev", device])
                try NetworkNamespaces.ip(["-n", host, "link", "set", device, "up"])
                try NetworkNamespaces.ip(["-n", host, "link", "set", "lo", "up"])
            }
        } catch {
            hosts.remove()
            throw error
        }
        return hosts
    }

    /// Cuts host `index` off from every other (or joins it again).
    public func setPort(_ index: Int, up: Bool) throws {
        try NetworkNamespaces.ip(["-n", switchHost, "link", "set", ports[index], up ? "up" : "down"])
    }

    public func remove() {
        for host in hosts + [switchHost] { _ = try? NetworkNamespaces.ip(["netns", "del", host]) }
    }

    /// The broker of a kernel on host `index` at the default port.
    public func broker(_ index: Int) -> String { "tcp://\(addresses[index]):5555" }

    /// `executable` on host `index` (``NetworkNamespaces/start(in:_:_:watched:)``).
    public func start(on index: Int, _ executable: URL, _ arguments: [String]) throws -> ChildProcess {
        try NetworkNamespaces.start(in: hosts[index], executable, arguments)
    }

    public func run(on index: Int, _ executable: URL, _ arguments: [String], seconds: Double = 30) async throws -> CommandResult {
        try await NetworkNamespaces.run(in: hosts[index], executable, arguments, seconds: seconds)
    }
}
