/**
 * The API's TypeBox schemas: request validation, response serialization and the OpenAPI
 * document all come from these. Each schema constant and its inferred type share one name.
 */
import { Type, type Static } from '@sinclair/typebox';
import { idPattern } from '../../../shared/src/ids.js';
import { DESKTOP_STATES } from '../store/rows.js';

export const Problem = Type.Object(
  {
    type: Type.String(),
    title: Type.String(),
    status: Type.Integer(),
    detail: Type.String(),
    operation_id: Type.Optional(Type.String()),
    currentSize: Type.Optional(Type.Integer()),
  },
  { $id: 'Problem', description: 'RFC 9457 problem details' },
);

export const Tier = Type.Union([Type.Literal('small'), Type.Literal('default'), Type.Literal('large')]);
export const DesktopStateSchema = Type.Union(DESKTOP_STATES.map((s) => Type.Literal(s)));

export const DesktopJson = Type.Object(
  {
    id: Type.String(),
    org_id: Type.String(),
    tier: Tier,
    state: DesktopStateSchema,
    image_version: Type.String(),
    generation: Type.Integer(),
    current_generation_id: Type.String(),
    idle_timeout_secs: Type.Integer(),
    billing_mode: Type.Union([Type.Literal('monthly'), Type.Literal('hourly')]),
    host_id: Type.String({ description: 'Empty until the desktop is placed on a host' }),
  },
  { $id: 'DesktopJson' },
);
export type DesktopJson = Static<typeof DesktopJson>;

export const ENV_KEY_PATTERN = '^[A-Za-z_][A-Za-z0-9_]*$';
export const IMAGE_VERSION_PATTERN = '^[a-z0-9][a-z0-9._-]{0,63}$';

export const CreateDesktopBody = Type.Object(
  {
    tier: Tier,
    billing_mode: Type.Optional(
      Type.Union([Type.Literal('monthly'), Type.Literal('hourly'), Type.Literal(''), Type.Null()]),
    ),
    image_version: Type.Optional(Type.Union([Type.String({ pattern: IMAGE_VERSION_PATTERN }), Type.Null()])),
    idle_timeout_secs: Type.Optional(Type.Union([Type.Integer({ minimum: 0, maximum: 2_147_483_647 }), Type.Null()])),
    env: Type.Optional(
      // TypeBox renders a patterned key as `patternProperties` only; without
      // `additionalProperties: false` a key that fails the pattern would be accepted unchecked.
      Type.Record(Type.String({ pattern: ENV_KEY_PATTERN }), Type.String(), { maxProperties: 100, additionalProperties: false }),
    ),
    setup_script: Type.Optional(Type.String()),
  },
  { additionalProperties: true },
);
export type CreateDesktopBody = Static<typeof CreateDesktopBody>;

export const UpdateDesktopBody = Type.Object(
  { idle_timeout_secs: Type.Optional(Type.Integer({ minimum: 0, maximum: 2_147_483_647 })) },
  { additionalProperties: true },
);
export type UpdateDesktopBody = Static<typeof UpdateDesktopBody>;

export const MutationBody = Type.Object(
  { expected_generation: Type.Optional(Type.Union([Type.Integer({ minimum: 0 }), Type.Null()])) },
  { additionalProperties: true },
);
export type MutationBody = Static<typeof MutationBody>;

export const ForkBody = Type.Object(
  {
    count: Type.Integer({ minimum: 1, maximum: 20 }),
    acknowledge_shared_state: Type.Literal(true),
    ephemeral: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: true },
);

export const OperationJson = Type.Object(
  {
    id: Type.String(),
    desktop_id: Type.String(),
    kind: Type.Union([Type.Literal('wake'), Type.Literal('hibernate'), Type.Literal('destroy'), Type.Literal('fork')]),
    state: Type.Union([Type.Literal('pending'), Type.Literal('running'), Type.Literal('succeeded'), Type.Literal('failed')]),
    result: Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()]),
    error: Type.Union([
      Type.Object({ code: Type.String(), message: Type.String() }, { additionalProperties: true }),
      Type.Null(),
    ]),
    created_at: Type.String({ format: 'date-time' }),
    settled_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
  },
  { $id: 'OperationJson' },
);
export type OperationJson = Static<typeof OperationJson>;

export const UsageResponse = Type.Object(
  {
    per_desktop: Type.Array(
      Type.Object({
        desktop_id: Type.String(),
        awake_seconds: Type.Number(),
        weighted_awake_seconds: Type.Number(),
        desktop_months: Type.Number(),
        billing_mode: Type.String(),
        projected_cost_cents: Type.Integer(),
      }),
    ),
    org_awake_seconds_weighted: Type.Number(),
    org_desktop_months: Type.Number(),
    org_projected_cost_cents: Type.Integer(),
  },
  { $id: 'UsageResponse' },
);

export const DesktopIdParams = Type.Object({ id: Type.String({ pattern: idPattern('desktop') }) });
export const OperationIdParams = Type.Object({ id: Type.String({ pattern: idPattern('operation') }) });
export const WaitQuery = Type.Object({
  wait: Type.Optional(Type.Union([Type.Literal('true'), Type.Literal('false')])),
});
export const IdempotencyHeaders = Type.Object({
  'idempotency-key': Type.Optional(Type.String({ minLength: 1, maxLength: 255 })),
});
