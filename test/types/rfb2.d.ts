/**
 * The part of rfb2 (a headless RFB client, used by tests only) that the tests use. The package's
 * own typings lack the `stream` option and the input messages. Only `createConnection` is a
 * named export Node can see in the CommonJS module, so nothing else is declared as one.
 */
declare module 'rfb2' {
  import type { EventEmitter } from 'node:events';
  import type { Duplex } from 'node:stream';

  export interface Rect {
    x: number;
    y: number;
    width: number;
    height: number;
    encoding: number;
    /** Pixel data of a raw rectangle. */
    data?: Buffer;
  }

  export interface RfbClient extends EventEmitter {
    width: number;
    height: number;
    title: string;
    bpp: number;
    requestUpdate(incremental: boolean, x: number, y: number, width: number, height: number): void;
    pointerEvent(x: number, y: number, buttons: number): void;
    keyEvent(keysym: number, isDown: boolean): void;
    end(): void;
    on(event: 'connect', listener: () => void): this;
    on(event: 'rect', listener: (rect: Rect) => void): this;
    on(event: 'resize', listener: (rect: Rect) => void): this;
    on(event: 'error', listener: (err: unknown) => void): this;
  }

  export interface ConnectionOptions {
    host?: string;
    port?: number;
    /** An already connected stream to speak RFB on, instead of dialing host:port. */
    stream?: Duplex;
    /** Encodings offered, best first (raw 0, copyRect 1, DesktopSize -223, ...); default raw, copyRect and DesktopSize. */
    encodings?: number[];
  }

  export function createConnection(options: ConnectionOptions): RfbClient;
}
