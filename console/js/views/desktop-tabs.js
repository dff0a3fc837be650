/**
 * The tabs of a desktop's page, in order; the first is the one a desktop opens on. Each is a view
 * module: `{ id, title, mount(element, { desktop }) → unmount }`. Unmounting must let go of what
 * the tab holds open (the screen's stream and its claim, the terminal's socket).
 */
import { filesTab } from './files.js';
import { portsTab } from './ports.js';
import { screenTab } from './screen.js';
import { terminalTab } from './terminal.js';

export const DESKTOP_TABS = [filesTab, screenTab, terminalTab, portsTab];
