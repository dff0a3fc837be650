/**
 * The guest-facing routes' TypeBox schemas (docs/api.md §4.3-4.6): exec and processes, files, and computer
 * use (display, screenshots, input, streams). Like schemas.ts, they are the single source of
 * request validation, response serialization and the OpenAPI document.
 */
import { Type, type Static } from '@sinclair/typebox';
import { idPattern } from '../../../shared/src/ids.js';
import { INPUT_LIMITS, InputAction, STREAM_CLAIMS } from '../../../shared/src/computer-use.js';
import { TERMINAL_SIZE } from '../../../shared/src/terminal-protocol.js';
import { ExecOutput, FileType, ProcessId } from '../../../shared/src/guest-commands.js';
import { CLOSED, DIGITS, NO_NUL } from './schemas.js';

/* ------------------------------------------------------------------ guest operations */

export const ExecBody = Type.Object(
  {
    command: Type.String({ minLength: 1, pattern: NO_NUL }),
    timeout_secs: Type.Optional(
      Type.Union([Type.Number(), Type.Null()], { description: 'Default 60, clamped to 1..300, never rejected; ignored when detached' }),
    ),
    detached: Type.Optional(Type.Boolean({ default: false })),
  },
  CLOSED,
);
export type ExecBody = Static<typeof ExecBody>;

export const ExecResponse = Type.Object({ ...ExecOutput.properties }, { $id: 'ExecResponse' });

export const ExecDetachedResponse = Type.Object({ process_id: Type.String() }, { $id: 'ExecDetachedResponse' });

export const ProcessParams = Type.Object({
  id: Type.String({ pattern: idPattern('desktop') }),
  process_id: ProcessId,
});


export const ProcessQuery = Type.Object({
  tail_bytes: Type.Optional(Type.String({ pattern: DIGITS, description: 'Integer; omitted or 0 gives 64 KiB; capped at 512 KiB' })),
});

export const ProcessStatusResponse = Type.Object(
  {
    process_id: Type.String(),
    status: Type.Union([Type.Literal('running'), Type.Literal('exited'), Type.Literal('lost')]),
    exit_code: Type.Integer({ description: 'The exit code when status is exited; -1 otherwise' }),
    stdout_tail: Type.String(),
    stderr_tail: Type.String(),
  },
  { $id: 'ProcessStatusResponse' },
);

export const FileStatJson = Type.Object(
  {
    path: Type.String({ description: 'Guest path without the leading /' }),
    fileType: FileType,
    sizeBytes: Type.Integer(),
    modifiedAt: Type.String({ format: 'date-time' }),
    mode: Type.String({ description: 'Permission bits as octal text' }),
  },
  { $id: 'FileStatJson' },
);

export const ListDirResponse = Type.Object(
  {
    path: Type.String(),
    entries: Type.Array(
      Type.Object({ name: Type.String(), fileType: FileType, sizeBytes: Type.Integer(), modifiedAt: Type.String({ format: 'date-time' }) }),
    ),
    truncated: Type.Boolean(),
  },
  { $id: 'ListDirResponse' },
);

export const GuestPathParams = Type.Object({
  id: Type.String({ pattern: idPattern('desktop') }),
  '*': Type.String({ description: 'Absolute guest path without the leading /' }),
});

export const BooleanText = Type.Union([Type.Literal('true'), Type.Literal('false')]);

export const FileReadQuery = Type.Object({
  offset: Type.Optional(Type.String({ pattern: DIGITS, description: 'int64 >= 0; a windowed read' })),
  length: Type.Optional(Type.String({ pattern: DIGITS, description: 'int64 >= 0, needs offset; default and max 8 MiB' })),
});

export const FileWriteQuery = Type.Object({
  append: Type.Optional(BooleanText),
  offset: Type.Optional(Type.String({ pattern: DIGITS, description: 'Required with append=true: the size the file must have' })),
});

export const FileDeleteQuery = Type.Object({ recursive: Type.Optional(BooleanText) });

/* ------------------------------------------------------------------ computer use */

export const DisplayResponse = Type.Object(
  { width: Type.Integer({ description: 'Pixels' }), height: Type.Integer({ description: 'Pixels' }) },
  { $id: 'DisplayResponse' },
);

export const ScreenshotBody = Type.Object(
  {
    encoding: Type.Optional(Type.Union([Type.Literal('binary'), Type.Literal('base64'), Type.Null()], {
      description: '`binary` (default): the PNG itself. `base64`: JSON {data_base64, width, height}',
    })),
    region: Type.Optional(Type.Union([
      Type.Object(
        {
          x: Type.Integer({ minimum: -32768, maximum: 32767 }),
          y: Type.Integer({ minimum: -32768, maximum: 32767 }),
          width: Type.Integer({ minimum: 1, maximum: 32767 }),
          height: Type.Integer({ minimum: 1, maximum: 32767 }),
        },
        { ...CLOSED, description: 'Screen pixels, all four together; clamped to the screen' },
      ),
      Type.Null(),
    ])),
    scale_percent: Type.Optional(Type.Union([Type.Integer({ minimum: 1, maximum: 100 }), Type.Null()], {
      description: 'Downscale percent of the (cropped) size; omitted means full size',
    })),
  },
  CLOSED,
);
export type ScreenshotBody = Static<typeof ScreenshotBody>;

export const ScreenshotBase64Response = Type.Object(
  {
    data_base64: Type.String({ description: 'The PNG, base64' }),
    width: Type.Integer({ description: 'Pixels, after the crop and the scale' }),
    height: Type.Integer({ description: 'Pixels, after the crop and the scale' }),
  },
  { $id: 'ScreenshotBase64Response' },
);

/**
 * The same actions as the agent protocol's union, each a named schema (`InputAction_key`), told
 * apart by `type` (`oneOf` with a discriminator): a bad action is then judged against the branch
 * its `type` names only, so the answer says `actions/0/repeat is not a known member` rather than
 * what a mouse move would need, and generated clients get one type per action.
 */
export const INPUT_ACTION_SCHEMAS = InputAction.anyOf.map((branch) => ({
  ...branch,
  $id: `InputAction_${String((branch.properties.type as { const: string }).const)}`,
}));

const DiscriminatedAction = Type.Unsafe<InputAction>({
  type: 'object',
  oneOf: INPUT_ACTION_SCHEMAS.map((branch) => ({ $ref: `${branch.$id}#` })),
  discriminator: { propertyName: 'type' },
});

export const InputBody = Type.Object(
  { actions: Type.Array(DiscriminatedAction, { maxItems: INPUT_LIMITS.maxActions }) },
  CLOSED,
);
export type InputBody = Static<typeof InputBody>;

export const InputResponse = Type.Object(
  { cursor: Type.Object({ x: Type.Integer(), y: Type.Integer() }) },
  { $id: 'InputResponse' },
);

export const StreamBody = Type.Object(
  {
    claim: Type.Union(STREAM_CLAIMS.map((c) => Type.Literal(c)), {
      description: '`view` watches; `control` also sends input, and makes exec and file routes answer 409 while held',
    }),
  },
  CLOSED,
);

export const StreamTicketResponse = Type.Object(
  {
    url: Type.String({ description: '`tcp://host:port/?ticket=…`: dial it, send the ticket and a newline, then speak RFB' }),
    ws_url: Type.Optional(
      Type.String({
        description:
          '`ws://host:port/vnc?ticket=…`: the same ticket as a WebSocket carrying RFB in binary frames (subprotocol `binary`, ' +
          'as noVNC offers it). Use either URL, once. Absent when the desktop\'s host is too old to serve it.',
      }),
    ),
    claim: Type.Union(STREAM_CLAIMS.map((c) => Type.Literal(c))),
    expires_at: Type.String({ format: 'date-time', description: 'The ticket must be presented before this; it is single use' }),
  },
  { $id: 'StreamTicketResponse' },
);

export const TerminalBody = Type.Object(
  {
    cols: Type.Optional(Type.Integer({ minimum: TERMINAL_SIZE.minCols, maximum: TERMINAL_SIZE.maxCols, default: TERMINAL_SIZE.defaultCols })),
    rows: Type.Optional(Type.Integer({ minimum: TERMINAL_SIZE.minRows, maximum: TERMINAL_SIZE.maxRows, default: TERMINAL_SIZE.defaultRows })),
    command: Type.Optional(
      Type.String({ minLength: 1, maxLength: 64 * 1024, pattern: NO_NUL, description: 'Run by `/bin/sh -c` instead of a login shell; the terminal ends when it exits' }),
    ),
  },
  CLOSED,
);

export const TerminalTicketResponse = Type.Object(
  {
    url: Type.String({ description: '`ws://host:port/terminal?ticket=…`: open it as a WebSocket, once, before `expires_at`' }),
    cols: Type.Integer(),
    rows: Type.Integer(),
    expires_at: Type.String({ format: 'date-time', description: 'The ticket must be presented before this; it is single use' }),
  },
  { $id: 'TerminalTicketResponse' },
);

export const DisplayBody = Type.Object(
  {
    width: Type.Integer({ minimum: 640, maximum: 2560 }),
    height: Type.Integer({ minimum: 480, maximum: 1600 }),
  },
  CLOSED,
);
