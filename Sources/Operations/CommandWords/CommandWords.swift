public import ArgumentParser

/// How `switchboard` and `sb` refuse a word where a verb should be (`sb kv set`,
/// `switchboard kernal`): naming the verbs there are, with the usage of the verb it was given
/// to, where the argument parser would say only that the word was not expected.
public enum CommandWords {
    /// The verb of `commands` that `word` names, by its name or an alias.
    public static func verb(named word: String, among commands: [any ParsableCommand.Type]) -> (any ParsableCommand.Type)? {
        commands.first { $0._commandName == word || $0.configuration.aliases.contains(word) }
    }

    /// The refusal of a word that names none of the verbs of `group` (`path`, as typed: "sb kv").
    public static func noSuchVerb(_ word: String, of group: any ParsableCommand.Type, path: String) -> String {
        "\(path) has no verb '\(word)'; its verbs: \(group.configuration.subcommands.map { $0._commandName }.joined(separator: ", "))"
    }

    /// Where the words of `arguments` from `start` on, read as verbs from `root` (`path`) down,
    /// come to one that names none of the verbs of the verb before it: that verb as typed, and
    /// the refusal naming its verbs. Nil when they do not (an option first, the last verb
    /// reached, or a word a default sub-verb takes as its own: `sb countries par`, unless
    /// `takesNoWord` says that default takes none).
    public static func unknownVerb(_ arguments: [String], from start: Int = 0, root: any ParsableCommand.Type, path: String,
                                   takesNoWord: (any ParsableCommand.Type) -> Bool = { _ in false }) -> (group: String, refusal: String)? {
        var index = start, group = root, path = path
        while index < arguments.count, !arguments[index].hasPrefix("-") {
            guard let command = verb(named: arguments[index], among: group.configuration.subcommands) else {
                if let byDefault = group.configuration.defaultSubcommand, !takesNoWord(byDefault) { return nil }
                return (path, noSuchVerb(arguments[index], of: group, path: path))
            }
            guard !command.configuration.subcommands.isEmpty else { return nil }
            (group, path, index) = (command, path + " " + command._commandName, index + 1)
        }
        return nil
    }

    /// The refusal as the programs print it on stderr, with the usage of `group` (as typed).
    public static func refusalText(group: String, _ refusal: String) -> String {
        "Error: \(refusal)\nUsage: \(group) <subcommand>\n  See '\(group) --help' for more information.\n"
    }
}
