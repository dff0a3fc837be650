/** What every desktop command names: the desktop, and the generation it was sent for (fencing). */
import { Type } from '@sinclair/typebox';

export const DesktopRef = {
  desktop_id: Type.String(),
  generation: Type.Integer({ minimum: 0 }),
};
