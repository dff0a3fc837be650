/**
 * The API's TypeBox schemas: request validation, response serialization and the OpenAPI
 * document all come from these. Each schema constant and its inferred type share one name.
 *
 * They sit below both layers that use them: services build the JSON these describe, and the HTTP
 * routes (http/) declare them. So this module imports neither, and services never import http/.
 */
import { Type, type Static } from '@sinclair/typebox';
import { idPattern } from '../../../shared/src/ids.js';
import { DESKTOP_STATES } from '../store/rows.js';
import { TierSchema } from '../../../shared/src/tiers.js';

/**
 * Request bodies are closed: an unknown member is answered 400 naming it, as a typo
 * (`idle_timout_secs`) must not pass for a default. Response objects stay open (docs/api.md §9: clients
 * ignore response fields they do not know).
 */
export const CLOSED = { additionalProperties: false } as const;

/**
 * Strings that reach a shell, execve or PostgreSQL cannot hold a NUL byte: refused by the schema,
 * so the document says so too.
 */
export const NO_NUL = '^[^\\u0000]*$';
/** Labels for people: no control characters. */
export const NO_CONTROL = '^[^\\p{Cc}]*$';

export const Problem = Type.Object(
  {
    type: Type.String(),
    title: Type.String(),
    status: Type.Integer(),
    detail: Type.String(),
    operation_id: Type.Optional(Type.String()),
    currentSize: Type.Optional(Type.Integer()),
    errors: Type.Optional(
      Type.Array(Type.Object({ field: Type.String(), message: Type.String() }), {
        description: 'On a 400 for a request that fails its schema: the field (`body/tier`) and what is wrong with it',
      }),
    ),
    request_id: Type.Optional(
      Type.String({ description: "On a 500: this request's id, also in the server's log line about it; quote it when reporting the error" }),
    ),
  },
  { $id: 'Problem', description: 'RFC 9457 problem details' },
);

export const Tier = TierSchema;
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
    host_status: Type.Union([Type.Literal('ready'), Type.Literal('down'), Type.Null()], {
      description:
        "Whether the desktop's host is heard from: `down` once its agent has been silent for a few seconds (guest " +
        'operations then answer 503 at once; an awake desktop is force-hibernated after the grace period). Null until placed.',
    }),
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
      // `propertyNames` says in the document what the server enforces of every key (a client
      // generator reads it; patternProperties alone reads as "keys like this are typed so").
      Type.Record(Type.String({ pattern: ENV_KEY_PATTERN }), Type.String({ pattern: NO_NUL }), {
        maxProperties: 100,
        additionalProperties: false,
        propertyNames: { pattern: ENV_KEY_PATTERN },
      }),
    ),
    setup_script: Type.Optional(Type.String({ pattern: NO_NUL, description: 'Run once as root at the first wake; no NUL byte' })),
  },
  CLOSED,
);
export type CreateDesktopBody = Static<typeof CreateDesktopBody>;

export const UpdateDesktopBody = Type.Object(
  { idle_timeout_secs: Type.Optional(Type.Integer({ minimum: 0, maximum: 2_147_483_647 })) },
  CLOSED,
);
export type UpdateDesktopBody = Static<typeof UpdateDesktopBody>;

export const MutationBody = Type.Object(
  // Any integer: one that differs from the generation fails the operation (docs/api.md §3.4), even one no desktop can be at.
  { expected_generation: Type.Optional(Type.Union([Type.Integer(), Type.Null()])) },
  CLOSED,
);
export type MutationBody = Static<typeof MutationBody>;

export const ForkBody = Type.Object(
  {
    count: Type.Integer({ minimum: 1, maximum: 20 }),
    acknowledge_shared_state: Type.Literal(true),
    ephemeral: Type.Optional(Type.Boolean()),
  },
  CLOSED,
);

export const OperationJson = Type.Object(
  {
    id: Type.String(),
    desktop_id: Type.String(),
    kind: Type.Union([Type.Literal('wake'), Type.Literal('hibernate'), Type.Literal('destroy'), Type.Literal('fork'), Type.Literal('move')], {
      description: '`move`: an operator moved the desktop to another host (its files, memory and running programs go with it)',
    }),
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

/** A query integer as text, up to int64's 19 digits (checked for digits here, converted by the route). */
export const DIGITS = '^[0-9]{1,19}$';

export const DesktopIdParams = Type.Object({ id: Type.String({ pattern: idPattern('desktop') }) });
export const OperationIdParams = Type.Object({ id: Type.String({ pattern: idPattern('operation') }) });
export const WaitQuery = Type.Object({
  wait: Type.Optional(Type.Union([Type.Literal('true'), Type.Literal('false')])),
});
export const IdempotencyHeaders = Type.Object({
  'idempotency-key': Type.Optional(Type.String({ minLength: 1, maxLength: 255 })),
});

/* ------------------------------------------------------------------ webhooks */

export const WEBHOOK_EVENT_TYPES = ['desktop.created', 'desktop.woken', 'desktop.hibernated', 'desktop.destroyed'] as const;
export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number];

// A plain enum rather than a union of literals: one clear validation message, one clear document entry.
export const WebhookEventTypeSchema = Type.Unsafe<WebhookEventType>({ type: 'string', enum: [...WEBHOOK_EVENT_TYPES] });

export const WebhookEndpointJson = Type.Object(
  {
    id: Type.String(),
    url: Type.String(),
    events: Type.Array(WebhookEventTypeSchema, { description: 'Subscribed event types' }),
    createdAt: Type.String({ format: 'date-time' }),
    secret: Type.Optional(Type.String({ description: 'Signing secret (`svc_whsec_…`); only in the create response' })),
  },
  { $id: 'WebhookEndpoint' },
);
export type WebhookEndpointJson = Static<typeof WebhookEndpointJson>;

/** The shape of an absolute http(s) URL without userinfo; the rest is checked on registration. */
const WEBHOOK_URL_PATTERN = '^[Hh][Tt][Tt][Pp][Ss]?://[^/?#@\\s\\\\]+([/?#]\\S*)?$';

export const CreateWebhookBody = Type.Object(
  {
    url: Type.String({
      maxLength: 2000,
      pattern: WEBHOOK_URL_PATTERN,
      description: 'Absolute https:// URL (http:// only where the deployment allows loopback); no userinfo; not a loopback or link-local host',
    }),
    events: Type.Array(WebhookEventTypeSchema, { minItems: 1, description: 'Non-empty; duplicates are removed' }),
  },
  CLOSED,
);
export type CreateWebhookBody = Static<typeof CreateWebhookBody>;

export const WebhookDeliveryJson = Type.Object(
  {
    id: Type.String({ description: 'Also sent as Svc-Webhook-Id; the same on every attempt' }),
    eventType: WebhookEventTypeSchema,
    state: Type.Union([Type.Literal('pending'), Type.Literal('delivered'), Type.Literal('failed')]),
    attempts: Type.Integer(),
    lastStatus: Type.Union([Type.Integer(), Type.Null()], { description: 'HTTP status of the last attempt' }),
    lastError: Type.Union([Type.String(), Type.Null()]),
    nextAttemptAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], { description: 'null once settled' }),
    payload: Type.Record(Type.String(), Type.Unknown(), { description: 'The exact JSON body POSTed' }),
    createdAt: Type.String({ format: 'date-time' }),
    deliveredAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], { description: 'Set on delivery; null before' }),
  },
  { $id: 'WebhookDelivery' },
);
export type WebhookDeliveryJson = Static<typeof WebhookDeliveryJson>;

export const WebhookIdParams = Type.Object({ id: Type.String({ pattern: idPattern('webhook') }) });

export const DeliveriesQuery = Type.Object({
  limit: Type.Optional(Type.String({ pattern: DIGITS, description: 'Integer 1..200; default 50' })),
});

/* ------------------------------------------------------------------ API keys */

export const ApiKeyJson = Type.Object(
  {
    id: Type.String({ description: '`key_…`' }),
    name: Type.Union([Type.String(), Type.Null()]),
    prefix: Type.Union([Type.String(), Type.Null()], {
      description: "The key's first characters (`svc_sk_` and five more), to tell keys apart; null for keys made before they were kept",
    }),
    created_at: Type.String({ format: 'date-time' }),
    last_used_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], { description: 'To the minute; null until first used' }),
  },
  { $id: 'ApiKeyJson' },
);

export const CreatedApiKeyJson = Type.Object(
  {
    ...ApiKeyJson.properties,
    key: Type.String({ description: 'The key itself, `svc_sk_…`: shown only in this response, stored hashed' }),
  },
  { $id: 'CreatedApiKeyJson' },
);

export const CreateApiKeyBody = Type.Object(
  {
    name: Type.Optional(
      Type.Union([Type.String({ minLength: 1, maxLength: 100, pattern: NO_CONTROL }), Type.Null()], { description: 'A label for people, 1-100 characters, no control characters' }),
    ),
  },
  CLOSED,
);
export type CreateApiKeyBody = Static<typeof CreateApiKeyBody>;

export const KeyIdParams = Type.Object({ id: Type.String({ pattern: idPattern('apiKey') }) });

/* ------------------------------------------------------------------ ports */

export const PortExposureJson = Type.Object(
  {
    id: Type.String(),
    port: Type.Integer({ minimum: 1, maximum: 65535, description: 'Guest TCP port' }),
    public: Type.Boolean(),
    url: Type.String({ description: '`https://{port}-{desktop_id}.{ingress_domain}`' }),
    status: Type.Union([Type.Literal('bound'), Type.Literal('unbound')], {
      description: '`bound`: the URL reaches the desktop now. `unbound`: the desktop is not awake or its host is down; the URL answers 503',
    }),
    created_at: Type.String({ format: 'date-time' }),
    token: Type.Optional(Type.String({
      description: 'Port token (`svc_pt_…`) of a private exposure; only in the create response, absent for public ones',
    })),
  },
  { $id: 'PortExposure' },
);
export type PortExposureJson = Static<typeof PortExposureJson>;

export const CreatePortBody = Type.Object(
  {
    port: Type.Integer({ minimum: 1, maximum: 65535, description: 'Guest TCP port' }),
    public: Type.Optional(Type.Boolean({ default: false, description: 'A public exposure needs no token at the ingress' })),
  },
  CLOSED,
);
export type CreatePortBody = Static<typeof CreatePortBody>;

export const PortParams = Type.Object({
  id: Type.String({ pattern: idPattern('desktop') }),
  port: Type.String({ description: 'Exposed guest port, 1..65535 (anything else is not found)' }),
});
