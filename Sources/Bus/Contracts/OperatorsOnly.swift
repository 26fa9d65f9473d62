/// What only an operator's key may ask of a bus with CURVE on: draining workers, restarting
/// services and reloading the configuration. The kernel refuses it from any other key
/// (-32011) before it reaches a worker; `sb` sends it with the operator's key
/// (`KEYS/operator.key`). Without CURVE no key can be told apart and nothing is refused.
public enum OperatorsOnly {
    /// Services whose every method is for operators.
    public static let services: Set<String> = [SupervisorAPI.service]
    /// The kernel's own methods that are for operators.
    public static let kernelMethods: Set<String> = [KernelAPI.workersDrain.name]

    /// Whether `method` of `service` is for operators only.
    public static func contains(service: String, method: String) -> Bool {
        services.contains(service) || service == KernelAPI.service && kernelMethods.contains(method)
    }
}
