/**
 * The API's response serializers are built once per distinct schema (http/app.ts): routes whose
 * answers share a schema share one serializer, and a schema that differs in any way gets its own,
 * which serializes by that schema alone.
 */
import { describe, expect, it } from 'vitest';
import { buildSerializerOncePerSchema } from '../../scheduler/src/http/app.js';

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

  it('keeps apps apart: each factory call builds its own', () => {
    const one = buildSerializerOncePerSchema(shared, {});
    const other = buildSerializerOncePerSchema({ Thing: { $id: 'Thing', type: 'object', properties: { id: { type: 'integer' } } } }, {});
    const schema = { $ref: 'Thing#' };
    expect(one(route('/a', schema))({ name: 'n', id: 1 })).toBe('{"name":"n"}');
    expect(other(route('/a', schema))({ name: 'n', id: 1 })).toBe('{"id":1}');
  });
});
