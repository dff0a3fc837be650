/**
 * Strings that break naive shell quoting, argument parsing or byte/character counting: quotes
 * and runs of them, command substitution, backslashes, line breaks and tabs, leading dashes,
 * non-ASCII and emoji, every shell metacharacter, and the empty string. Tests feed them through
 * the real shell and check they come back unchanged.
 */
export const NASTY = [
  '',
  "it's",
  "'''",
  "'x'x'",
  '$(touch /tmp/pwned) `id` ${HOME} $HOME',
  'back\\slash\\\\ and \\n',
  'line1\nline2\r\n\ttab',
  '-starts-with-dash',
  '--',
  '"double" \'single\'',
  'é€日本語 😀 \u00a0',
  '* ? [a] ~ # ; & | < > ( ) { } !',
];
