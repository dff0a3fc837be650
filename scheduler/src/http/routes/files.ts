/**
 * Files (docs/api.md §4.4): read (whole or a window), write or append, delete, stat, list. Bodies stream:
 * an upload is passed to the agent as it arrives, and a read is piped from the agent to the
 * response, so the scheduler holds a file's bytes only in flight, never a whole file.
 *
 * The write route lives in its own Fastify context whose only body parser hands the raw request
 * stream through, whatever the content type: a file is bytes, and `curl --data-binary` labels
 * them as a form. Its size cap is the file chunk cap (8 MiB), not the 2 MiB JSON cap, and is
 * enforced both from Content-Length (before anything is sent) and while counting the stream.
 */
import { Readable } from 'node:stream';
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { errors } from '../../errors.js';
import { FILE_CHUNK_MAX_BYTES } from '../../services/guest.js';
import { apiPath, guestPath } from '../guest-paths.js';
import { FileDeleteQuery, FileReadQuery, FileStatJson, FileWriteQuery, GuestPathParams, ListDirResponse } from '../../api/guest-schemas.js';

const octetStream = {
  description: 'The file, or the requested window of it',
  // @fastify/swagger wraps each header's JSON schema in `{schema, description}` itself.
  headers: {
    'X-Svc-File-Size': { type: 'integer', minimum: 0, description: 'Total size of the file' },
    'X-Svc-Eof': { type: 'string', enum: ['true', 'false'], description: 'The window reaches the end of the file' },
  },
  content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } },
};

const noContent = { description: 'Done', type: 'null' };

const INT64_MAX = 2n ** 63n - 1n;

/**
 * A query integer (already digits by schema): an int64, as the contract types offsets and
 * lengths. Values past 2^53 are held as 2^53 - 1: no file is that large, so an offset there is
 * past the end either way (an empty read, a failed append guard) and a length is over the cap.
 */
function queryInteger(value: string, name: string): number {
  if (BigInt(value) > INT64_MAX) throw errors.badRequest(`${name} is out of range: at most ${INT64_MAX}`);
  return Math.min(Number(value), Number.MAX_SAFE_INTEGER);
}

/** Why an upload stopped early; the agent only sees that it was aborted. */
interface UploadOutcome {
  tooLarge: boolean;
  cut: boolean;
}

/** Yields the request body while counting it; past `limit`, or when the client goes, it throws. */
async function* limited(source: AsyncIterable<Buffer>, limit: number, outcome: UploadOutcome): AsyncGenerator<Buffer> {
  let total = 0;
  try {
    for await (const chunk of source) {
      total += chunk.length;
      if (total > limit) {
        outcome.tooLarge = true;
        throw new Error('upload over the chunk cap');
      }
      yield chunk;
    }
  } catch (err) {
    if (!outcome.tooLarge) outcome.cut = true;
    throw err;
  }
}

const tooLargeBody = () => {
  const err = errors.tooLarge(`a file chunk is at most ${FILE_CHUNK_MAX_BYTES} bytes`);
  // The rest of the body is not read: the connection cannot be reused.
  err.headers.connection = 'close';
  return err;
};

export function registerFileRoutes(app: App, deps: AppDeps): void {
  app.get(
    '/v1/desktops/:id/files/*',
    {
      schema: {
        summary: 'Read a file, whole or a window of it',
        params: GuestPathParams,
        querystring: FileReadQuery,
        response: { 200: octetStream, ...errorResponses(400, 404, 409, 413, 504) },
      },
    },
    async (request, reply) => {
      const path = guestPath(request.params['*']);
      const { offset: rawOffset, length: rawLength } = request.query;
      if (rawLength !== undefined && rawOffset === undefined) throw errors.badRequest('length needs offset');
      const offset = rawOffset === undefined ? null : queryInteger(rawOffset, 'offset');
      const length = rawLength === undefined ? FILE_CHUNK_MAX_BYTES : queryInteger(rawLength, 'length');
      if (length > FILE_CHUNK_MAX_BYTES) throw errors.badRequest(`length is at most ${FILE_CHUNK_MAX_BYTES}`);
      const { result, body } = await deps.guest.readFile(request.orgId, request.params.id, path, offset, length);
      return reply
        .code(200)
        .type('application/octet-stream')
        .header('content-length', result.length)
        .header('x-svc-file-size', result.size)
        .header('x-svc-eof', String(result.eof))
        .send(Readable.from(body));
    },
  );

  app.get(
    '/v1/desktops/:id/files-meta/*',
    {
      schema: {
        summary: 'Stat a path (a final symlink is reported, not followed)',
        params: GuestPathParams,
        response: { 200: Type.Ref(FileStatJson), ...errorResponses(400, 404, 409, 504) },
      },
    },
    async (request) => {
      const path = guestPath(request.params['*']);
      const st = await deps.guest.stat(request.orgId, request.params.id, path);
      return { path: apiPath(path), fileType: st.file_type, sizeBytes: st.size_bytes, modifiedAt: st.modified_at, mode: st.mode };
    },
  );

  app.get(
    '/v1/desktops/:id/dir/*',
    {
      schema: {
        summary: 'List a directory: direct children in byte order, at most 2000',
        params: GuestPathParams,
        response: { 200: Type.Ref(ListDirResponse), ...errorResponses(400, 404, 409, 504) },
      },
    },
    async (request) => {
      const path = guestPath(request.params['*'], { allowEmpty: true });
      const list = await deps.guest.listDir(request.orgId, request.params.id, path);
      return {
        path: apiPath(path),
        entries: list.entries.map((e) => ({ name: e.name, fileType: e.file_type, sizeBytes: e.size_bytes, modifiedAt: e.modified_at })),
        truncated: list.truncated,
      };
    },
  );

  app.delete(
    '/v1/desktops/:id/files/*',
    {
      schema: {
        summary: 'Delete a file, a symlink, or (with recursive=true) a directory tree',
        params: GuestPathParams,
        querystring: FileDeleteQuery,
        response: { 204: noContent, ...errorResponses(400, 404, 409, 504) },
      },
    },
    async (request, reply) => {
      const path = guestPath(request.params['*'], { refuseRoot: true });
      await deps.guest.deletePath(request.orgId, request.params.id, path, request.query.recursive === 'true');
      return reply.code(204).send();
    },
  );

  void app.register(async (raw) => {
    const scope = raw as unknown as App;
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', (_request, payload, done) => done(null, payload));
    scope.put(
      '/v1/desktops/:id/files/*',
      {
        schema: {
          summary: 'Write a file (replace), or append one chunk at the given offset',
          description:
            'The body is the raw bytes, at most 8 MiB. A write replaces the file atomically; an append is ' +
            'accepted only when the file size equals `offset` (409 with `currentSize` otherwise), so chunks are retry-safe.',
          params: GuestPathParams,
          querystring: FileWriteQuery,
          response: { 204: noContent, ...errorResponses(400, 404, 409, 413, 504) },
        },
        // The body is a stream, checked by counting: no body schema to validate, but the
        // document still describes it (app.ts).
        config: { rawBody: true },
      },
      async (request, reply) => {
        const path = guestPath(request.params['*']);
        const { append, offset } = request.query;
        if (append === 'true' && offset === undefined) throw errors.badRequest('append=true needs offset');
        const appendAt = append === 'true' ? queryInteger(offset!, 'offset') : null;
        const declared = Number(request.headers['content-length'] ?? 0);
        if (declared > FILE_CHUNK_MAX_BYTES) throw tooLargeBody();
        const stream = request.body instanceof Readable ? request.body : Readable.from([]);
        const outcome: UploadOutcome = { tooLarge: false, cut: false };
        try {
          await deps.guest.writeFile(request.orgId, request.params.id, path, appendAt, limited(stream, FILE_CHUNK_MAX_BYTES, outcome));
        } catch (err) {
          // The agent saw an aborted upload and changed nothing; say why it was aborted.
          if (outcome.tooLarge) throw tooLargeBody();
          if (outcome.cut) throw errors.badRequest('the request body was cut off');
          throw err;
        }
        return reply.code(204).send();
      },
    );
  });
}
