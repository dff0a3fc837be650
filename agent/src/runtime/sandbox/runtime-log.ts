/**
 * How the sandbox runtime reports: a message, its fields, and `warn` for what an operator should
 * look at — a desktop that lost its running programs (a hibernate without its memory, a restore
 * that fell back to a cold boot), files or groups that could not be removed, a fallback to a
 * slower path. Everything else is information.
 */
export type RuntimeLog = (msg: string, fields?: object, level?: 'warn') => void;
