/** The release of this build, as package.json names it: replicas and agents report it. */
import pkg from '../../package.json' with { type: 'json' };

export const CANTO_VERSION: string = pkg.version;
