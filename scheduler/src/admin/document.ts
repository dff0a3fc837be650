/**
 * The admin API's own OpenAPI 3.1 document, generated from its route schemas like the `/v1` one
 * (http/app.ts) but kept apart from it: client generators and readers of the tenant API must not
 * see fleet operations. A second @fastify/swagger instance, registered inside the admin plugin,
 * hears only the admin routes; the `/v1` document leaves out every route marked `admin`.
 */
import swagger from '@fastify/swagger';
import { Type } from '@sinclair/typebox';
import type { App } from '../http/route-types.js';
import { markOptionalBodies } from '../http/app.js';

export const ADMIN_TAGS = [
  { name: 'Hosts', description: 'Agent hosts: capacity, use, cordon, removal' },
  { name: 'Desktops', description: 'Desktops of every org: where each is, and the operation at work on it' },
  { name: 'Moves and drains', description: 'Moving desktops between hosts, one or a whole host at a time' },
  { name: 'Orgs and keys', description: "Orgs and their API keys (a key's secret only when it is created)" },
  { name: 'Meta', description: 'This document' },
];

interface Document {
  paths?: object;
  components?: { schemas?: Record<string, unknown> };
}

/**
 * Shared schemas the admin routes never reference: the `/v1` ones every Fastify context inherits
 * would otherwise be listed in this document's components.
 */
function dropUnreferencedSchemas<T extends Document>(document: T): T {
  const schemas = document.components?.schemas;
  if (!schemas) return document;
  const wanted = new Set<string>();
  const visit = (value: unknown): void => {
    if (Array.isArray(value)) return value.forEach(visit);
    if (value === null || typeof value !== 'object') return;
    for (const [key, inner] of Object.entries(value)) {
      if (key === '$ref' && typeof inner === 'string' && inner.startsWith('#/components/schemas/')) {
        const name = inner.slice('#/components/schemas/'.length);
        if (!wanted.has(name)) {
          wanted.add(name);
          visit(schemas[name]);
        }
      } else visit(inner);
    }
  };
  visit(document.paths);
  for (const name of Object.keys(schemas)) if (!wanted.has(name)) delete schemas[name];
  return document;
}

/** Registers the admin document's generator in `admin` (the admin plugin's context) and its route. */
export async function registerAdminDocument(admin: App): Promise<void> {
  await admin.register(swagger, {
    decorator: 'adminSwagger',
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Canto admin API',
        version: '1.0.0',
        description: 'Fleet and tenant administration for operators, authenticated by the deployment admin token (CANTO_ADMIN_TOKEN).',
      },
      servers: [{ url: '/', description: 'this deployment' }],
      tags: ADMIN_TAGS,
      components: { securitySchemes: { admin_token: { type: 'http', scheme: 'bearer', description: 'The admin token, CANTO_ADMIN_TOKEN' } } },
      security: [{ admin_token: [] }],
    },
    refResolver: { buildLocalReference: (json, _base, _frag, i) => (json.$id as string) ?? `def-${i}` },
    transformObject: (document) =>
      'openapiObject' in document ? markOptionalBodies(dropUnreferencedSchemas(document.openapiObject)) : document.swaggerObject,
  });

  admin.get(
    '/admin/v1/openapi.json',
    {
      config: { public: true },
      schema: {
        summary: 'This OpenAPI 3.1 document (no credential needed)',
        operationId: 'getAdminOpenApiDocument',
        tags: ['Meta'],
        security: [],
        response: { 200: Type.Object({}, { additionalProperties: true }) },
      },
    },
    async () => (admin as unknown as { adminSwagger(): unknown }).adminSwagger(),
  );
}
