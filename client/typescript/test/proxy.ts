// A TCP proxy on loopback that a Node test controls (tests/harness/proxy.py's modes, for these tests):
// forward, drop what the server sends while the connections stay open, or cut every connection (RST).
import * as net from "node:net";

/** A proxy to one `host:port`; each accepted connection gets its own upstream connection. */
export class Proxy {
  /** The proxy's own address, `127.0.0.1:PORT`. */
  address = "";
  private readonly server: net.Server;
  private readonly sockets = new Set<net.Socket>();
  /** Whether bytes from the server reach the client; false: read and dropped. */
  private down = true;

  private constructor(upstream: string) {
    const colon = upstream.lastIndexOf(":");
    const [host, port] = [upstream.slice(0, colon), Number(upstream.slice(colon + 1))];
    this.server = net.createServer((client) => {
      const server = net.connect(port, host);
      for (const [from, to] of [[client, server], [server, client]] as const) {
        this.sockets.add(from);
        from.on("data", (chunk: Buffer) => {
          if (from === client || this.down) to.write(chunk);
        });
        from.on("close", () => {
          this.sockets.delete(from);
          to.destroy();
        });
        from.on("error", () => to.destroy());
      }
    });
  }

  /** A proxy to `upstream` (`host:port`), listening on a free port of 127.0.0.1. */
  static async start(upstream: string): Promise<Proxy> {
    const proxy = new Proxy(upstream);
    await new Promise<void>((resolve) => proxy.server.listen(0, "127.0.0.1", resolve));
    proxy.address = `127.0.0.1:${(proxy.server.address() as net.AddressInfo).port}`;
    return proxy;
  }

  /**
   * Drop every byte the server sends from now on (its answers are lost); the connections stay open. Their
   * streams are broken for good: end this with {@link cut}.
   */
  dropDown(): void {
    this.down = false;
  }

  /** Close every open connection with RST on both sides, and forward both ways on the new ones. */
  cut(): void {
    this.down = true;
    for (const socket of this.sockets) socket.resetAndDestroy();
  }

  /** Stop listening and close every connection. */
  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
