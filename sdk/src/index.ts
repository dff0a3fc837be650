/**
 * The Canto TypeScript SDK: typed clients of the `/v1` API and the admin API, generated from the
 * OpenAPI documents the scheduler serves, with the helpers around them (idempotent lifecycle
 * calls, operation waits, retries of 503/429, streaming files, problems as exceptions).
 */
export { Canto, createCanto, type CantoOptions, type CallOptions, type LifecycleOptions, type Desktop, type DesktopState, type ExecResult, type ProcessStatus, type CreateDesktopBody, type ForkBody } from './client.js';
export { CantoAdmin, createCantoAdmin, type CantoAdminOptions, type AdminHost, type AdminOrg, type AdminKey, type AdminCreatedKey, type AdminOperation, type AdminDesktop } from './admin.js';
export { Files, iterableToStream, type UploadBody, type UploadOptions, type DownloadOptions, type Download, type FileStat, type DirListing } from './files.js';
export { OperationFailedError, OperationTimeoutError, isSettled, type Operation, type OperationLike, type WaitOptions } from './operations.js';
export {
  CantoProblem, BadRequestProblem, UnauthorizedProblem, NotFoundProblem, ConflictProblem, PayloadTooLargeProblem, RateLimitedProblem,
  NotImplementedProblem, UnavailableProblem, GatewayTimeoutProblem, CantoConnectionError, type ProblemBody, type ProblemKind,
} from './problem.js';
export { retryDelayMs, isRetrySafe, type RetryOptions, type FetchLike } from './retry.js';
export { unwrap, type TransportOptions } from './transport.js';
export type { paths, components, operations } from './generated/api.js';
export type { paths as adminPaths, operations as adminOperations } from './generated/admin.js';
