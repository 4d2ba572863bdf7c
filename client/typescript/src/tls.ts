/**
 * TLS options of the client: PEM files read when the client is made, and
 * again when they change on disk ({@link TlsFiles}): a certificate renewed
 * by swapping new files in (a rename over the old file, a Kubernetes Secret
 * volume's `..data` symlink swap) is used at the next connection.
 *
 * @module
 */

import { readFileSync, statSync } from "node:fs";
import { X509Certificate, createPrivateKey } from "node:crypto";
import { InvalidArgument } from "./errors.js";

/** TLS settings of a {@link LockClient}. Any of them set means TLS; none means plaintext. */
export interface TlsOptions {
  /** Path of a PEM bundle of the CAs to trust; undefined: Node's default CAs. */
  ca?: string;
  /** Path of a PEM client certificate, for a coordinator that requires one (needs `key`). */
  cert?: string;
  /** Path of the client certificate's unencrypted PEM key. */
  key?: string;
  /** The name to check in the coordinator's certificate instead of the address's host (`localhost` over a unix socket). */
  serverName?: string;
}

/** The TLS material, read and checked. */
export interface TlsMaterial {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
  serverName?: string;
}

function readPem(path: unknown, field: string): Buffer {
  if (typeof path !== "string" || path === "") {
    throw new InvalidArgument(`${field} must be the path of a PEM file, got ${JSON.stringify(path)}`, { field });
  }
  let data: Buffer;
  try {
    data = readFileSync(path);
  } catch (err) {
    throw new InvalidArgument(`${field}: cannot read ${path}: ${(err as Error).message}`, { field, cause: err });
  }
  if (!data.includes("-----BEGIN ")) throw new InvalidArgument(`${field}: ${path} holds no PEM block`, { field });
  return data;
}

/**
 * Read and check the TLS files.
 *
 * @returns The material, or undefined for plaintext (no option set).
 * @throws {@link InvalidArgument} (field `tls.ca`, `tls.cert`, `tls.key` or
 *   `tls.serverName`): a file is missing, unreadable or not PEM, `cert`
 *   comes without `key` (or the reverse), or the key is not the certificate's.
 */
export function readTls(options: TlsOptions | undefined): TlsMaterial | undefined {
  if (options === undefined) return undefined;
  if (typeof options !== "object" || options === null) {
    throw new InvalidArgument("tls must be an object of TLS options", { field: "tls" });
  }
  const out: TlsMaterial = {};
  if (options.ca !== undefined) {
    out.ca = readPem(options.ca, "tls.ca");
    try {
      new X509Certificate(out.ca);
    } catch (err) {
      throw new InvalidArgument(`tls.ca: ${options.ca} holds no certificate`, { field: "tls.ca", cause: err });
    }
  }
  if ((options.cert === undefined) !== (options.key === undefined)) {
    const missing = options.cert === undefined ? "tls.cert" : "tls.key";
    throw new InvalidArgument(`${missing} is needed with ${missing === "tls.cert" ? "tls.key" : "tls.cert"}`, {
      field: missing,
    });
  }
  if (options.cert !== undefined && options.key !== undefined) {
    out.cert = readPem(options.cert, "tls.cert");
    out.key = readPem(options.key, "tls.key");
    let cert: X509Certificate;
    try {
      cert = new X509Certificate(out.cert);
    } catch (err) {
      throw new InvalidArgument(`tls.cert: ${options.cert} holds no certificate`, { field: "tls.cert", cause: err });
    }
    let matches = false;
    try {
      matches = cert.checkPrivateKey(createPrivateKey(out.key));
    } catch (err) {
      throw new InvalidArgument(`tls.key: ${options.key} holds no usable unencrypted key`, {
        field: "tls.key",
        cause: err,
      });
    }
    if (!matches) throw new InvalidArgument(`tls.key: ${options.key} is not the key of tls.cert`, { field: "tls.key" });
  }
  if (options.serverName !== undefined) {
    if (typeof options.serverName !== "string" || options.serverName === "") {
      throw new InvalidArgument("tls.serverName must be a non-empty host name", { field: "tls.serverName" });
    }
    out.serverName = options.serverName;
  }
  return out;
}

/** What identifies the version of each file on disk (through symlinks): device, inode, size, mtime, ctime. */
function stamps(options: TlsOptions): string {
  return [options.ca, options.cert, options.key].map((path) => {
    if (path === undefined) return "-";
    try {
      const st = statSync(path, { bigint: true });
      return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
    } catch {
      return "missing";
    }
  }).join("|");
}

/** When a certificate expires, and its file, for the messages of refused handshakes. */
export function certificateProblem(material: TlsMaterial | undefined, file: string | undefined): string | undefined {
  if (!material?.cert) return undefined;
  const cert = new X509Certificate(material.cert);
  const now = Date.now();
  if (now >= Date.parse(cert.validTo)) {
    return `the client certificate in tls.cert (${file}) expired at ${new Date(cert.validTo).toISOString()}`;
  }
  if (now < Date.parse(cert.validFrom)) {
    return `the client certificate in tls.cert (${file}) is not valid until ${new Date(cert.validFrom).toISOString()}`;
  }
  return undefined;
}

/**
 * A client's TLS files: read when the client is made, read again by
 * {@link TlsFiles.current} when they changed on disk. New files that cannot
 * be used (half written, a key that is not the certificate's) leave the
 * material in use, with one warning naming the file; the next change is
 * tried again.
 */
export class TlsFiles {
  readonly options: TlsOptions;
  private material: TlsMaterial;
  private seen: string;

  /**
   * @param options - The TLS options.
   * @throws {@link InvalidArgument} as {@link readTls}.
   */
  constructor(options: TlsOptions) {
    this.material = readTls(options)!;
    this.options = options;
    this.seen = stamps(options);
  }

  /** The material as the files are now: read again when they changed since the last look. */
  current(): TlsMaterial {
    const now = stamps(this.options);
    if (now !== this.seen) {
      this.seen = now;
      try {
        this.material = readTls(this.options)!;
      } catch (err) {
        console.warn(`fencepost: TLS files changed but cannot be used, the ones read before stay: ${(err as Error).message}`);
      }
    }
    return this.material;
  }

  /** Why the client certificate in use is not valid now (expired, not yet valid), naming its file; undefined if it is. */
  problem(): string | undefined {
    return certificateProblem(this.material, this.options.cert);
  }
}
