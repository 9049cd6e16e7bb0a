"""The ext_proc hop's transport: DLB's own asyncio HTTP/2 gRPC server (:mod:`.h2`).

May import only the foundations (``dlb.log``): it knows gRPC framing, not what the messages mean.
"""
