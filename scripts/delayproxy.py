"""A TCP proxy that holds every chunk for a fixed time in each direction.

scripts/replica puts it between the scratch cluster and its synchronous
replica, so a commit waits for a round trip as it would to a replica in
another zone or region (this machine's kernel has no netem to do it).
Order is kept: chunks leave in the order they came, each no earlier than
its arrival plus the delay.

    python3 scripts/delayproxy.py LISTEN_PORT TARGET_PORT ONE_WAY_MS
"""
import asyncio
import sys
import time


async def relay(reader, writer, delay):
    queue = asyncio.Queue()

    async def take():
        while True:
            data = await reader.read(65536)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def give():
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    await asyncio.gather(take(), give())


async def serve(listen, target, delay):
    async def connection(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(relay(client_r, server_w, delay), relay(server_r, client_w, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(connection, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen, target, ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    asyncio.run(serve(listen, target, ms / 1000))
