/**
 * The tabs of a desktop's page, in order. Each is a view module: `{ id, title, mount(element,
 * { desktop }) → unmount }`. The live screen (noVNC over the screen stream) and the terminal
 * (xterm.js over a terminal's WebSocket) are added here as two more entries.
 */
import { filesTab } from './files.js';
import { portsTab } from './ports.js';

export const DESKTOP_TABS = [filesTab, portsTab];
