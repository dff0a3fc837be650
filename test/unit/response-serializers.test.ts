/**
 * The API's response serializers are built once per distinct schema (http/serializers.ts): routes whose
 * answers share a schema share one serializer, and a schema that differs in any way gets its own,
 * which serializes by that schema alone, built with only the shared schemas it refers to.
 */
import { describe, expect, it } from 'vitest';
import { buildSerializerOncePerSchema } from '../../scheduler/src/http/serializers.js';

const shared = {
  Thing: { $id: 'Thing', type: 'object', properties: { name: { type: 'string' } }, required: ['name'] },
};

const route = (url: string, schema: unknown) => ({ method: 'GET', url, httpStatus: '200', schema });

describe('response serializers', () => {
  it('shares one serializer among routes whose schemas are equal, and builds one per distinct schema', () => {
    const compile = buildSerializerOncePerSchema(shared, {});
    const thingRef = () => ({ $ref: 'Thing#' });
    const a = compile(route('/a', thingRef()));
    const b = compile(route('/b', thingRef()));
    expect(b).toBe(a);
    expect(a({ name: 'x', secret: 'never sent' })).toBe('{"name":"x"}');

    const withCount = compile(route('/c', { type: 'object', properties: { name: { type: 'string' }, count: { type: 'integer' } } }));
    expect(withCount).not.toBe(a);
    expect(withCount({ name: 'x', count: 3, secret: 'no' })).toBe('{"name":"x","count":3}');
    // The same properties in another order are another schema (and another order of output).
    const reordered = compile(route('/d', { type: 'object', properties: { count: { type: 'integer' }, name: { type: 'string' } } }));
    expect(reordered).not.toBe(withCount);
    expect(reordered({ name: 'x', count: 3 })).toBe('{"count":3,"name":"x"}');
  });

  it('builds each with the shared schemas it reaches, through references of references, and no others', () => {
    const compile = buildSerializerOncePerSchema({
      Outer: { $id: 'Outer', type: 'object', properties: { inner: { $ref: 'Inner#' }, list: { type: 'array', items: { $ref: 'Item' } } } },
      Inner: { $id: 'Inner', type: 'object', properties: { n: { type: 'integer' } } },
      Item: { $id: 'Item', type: 'string' },
      // Never reached: building with every shared schema would validate it, and fail.
      Broken: { $id: 'Broken', type: 'no such type' },
    }, {});
    const serialize = compile(route('/outer', { $ref: 'Outer#' }));
    expect(serialize({ inner: { n: 2, x: 1 }, list: ['a', 'b'], other: true })).toBe('{"inner":{"n":2},"list":["a","b"]}');
    expect(() => compile(route('/broken', { $ref: 'Broken#' }))).toThrow(/invalid/);
  });

  it('keeps apps apart: each factory call builds its own', () => {
    const one = buildSerializerOncePerSchema(shared, {});
    const other = buildSerializerOncePerSchema({ Thing: { $id: 'Thing', type: 'object', properties: { id: { type: 'integer' } } } }, {});
    const schema = { $ref: 'Thing#' };
    expect(one(route('/a', schema))({ name: 'n', id: 1 })).toBe('{"name":"n"}');
    expect(other(route('/a', schema))({ name: 'n', id: 1 })).toBe('{"id":1}');
  });
});
