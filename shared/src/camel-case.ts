/**
 * The agent link speaks snake_case (like the public API); TypeScript inside the agent speaks
 * camelCase. Rather than hand-copying each protocol shape as a camelCase interface, the runtime
 * driver's types are the protocol's types with their keys renamed by `CamelKeys`, so a field
 * added to or removed from the protocol shows up in the driver's types, and a translation in the
 * agent's command table that forgets it does not compile.
 */

/** `max_output_bytes` → `maxOutputBytes`. */
export type CamelCase<S extends string> = S extends `${infer Head}_${infer Tail}` ? `${Head}${Capitalize<CamelCase<Tail>>}` : S;

/** An object type with every key in camelCase, read-only, through arrays of objects too. */
export type CamelKeys<T> = {
  readonly [K in keyof T as K extends string ? CamelCase<K> : K]: T[K] extends readonly (infer E)[]
    ? E extends object
      ? CamelKeys<E>[]
      : T[K]
    : T[K];
};
