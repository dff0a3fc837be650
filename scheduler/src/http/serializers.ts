/**
 * The API's response serializers: Fastify's own (fast-json-stringify), built once per distinct
 * schema and each with only the shared schemas it refers to. Fastify builds one per route and
 * status code as the app starts: about 450 here, of 35 distinct schemas (every route's error
 * statuses name the one problem schema), and each build validates and resolves every shared
 * schema the app has again. That was about 0.6 s of a scheduler process's 1.8 s start, in every
 * cluster worker, every restart, and each of the many schedulers the tests start. A serializer
 * depends only on its schema and the shared schemas it reaches, the same for every route.
 */
import { SerializerSelector } from '@fastify/fast-json-stringify-compiler';

type Factory = ReturnType<typeof SerializerSelector>;

const buildFastSerializer = SerializerSelector();

export function buildSerializerOncePerSchema(...[externalSchemas, options]: Parameters<Factory>): ReturnType<Factory> {
  const shared = (externalSchemas ?? {}) as Record<string, unknown>;
  const built = new Map<string, ReturnType<ReturnType<Factory>>>();
  return (route) => {
    const key = JSON.stringify(route.schema);
    let serializer = built.get(key);
    if (serializer === undefined) {
      serializer = buildFastSerializer(reached(route.schema, shared), options)(route);
      built.set(key, serializer);
    }
    return serializer;
  };
}

/**
 * The shared schemas `schema` refers to (`$ref: "Name"` or `"Name#…"`), and those they refer to
 * in turn. A reference this misses fails the build as the app starts, never a request.
 */
function reached(schema: unknown, shared: Record<string, unknown>): Record<string, unknown> {
  const found: Record<string, unknown> = {};
  const pending: unknown[] = [schema];
  while (pending.length > 0) {
    const node = pending.pop();
    if (Array.isArray(node)) {
      pending.push(...node);
    } else if (typeof node === 'object' && node !== null) {
      for (const [name, value] of Object.entries(node)) {
        if (name === '$ref' && typeof value === 'string') {
          const id = value.split('#', 1)[0]!;
          if (id !== '' && !(id in found) && id in shared) {
            found[id] = shared[id];
            pending.push(shared[id]);
          }
        } else {
          pending.push(value);
        }
      }
    }
  }
  return found;
}
