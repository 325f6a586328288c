import asyncio, json, uuid
from tests.support.gateway import ADMIN_KEY

async def raw(port, data: bytes):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data); await w.drain()
    out = await r.read()
    w.close()
    return out

async def test_probe(api):
    client, tid = await api.tenant_user()
    admin = await api.admin()
    deep = "[" * 5000 + "]" * 5000
    r = await client.call("POST", "/v1/allocations", data=deep.encode(), headers={"Content-Type": "application/json"})
    print("deep", r.status, r.content_type, str(r.body)[:200])
    r = await client.post("/v1/allocations", {"name": "a", "shape": "vm.1gpu", "labels": {"k": "a\u0000b"}})
    print("nul label", r.status, str(r.body)[:300])
    r = await admin.post("/v1/nodes", {"name": "n1", "gpu_model": "H\u0000100", "gpu_count": 8})
    print("nul gpu_model", r.status, str(r.body)[:300])
    r = await admin.post("/v1/nodes", {"name": "n2", "gpu_model": "H100", "gpu_count": 8, "region": "e\u0000u"})
    print("nul region", r.status, str(r.body)[:300])
    port = api.rt.port
    out = await raw(port, b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    print("long line", out[:400])
    out = await raw(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n")
    print("long header", out[:400])
    r = await admin.get("/v1/ops/dead-letters?limit=&limit=junk")
    print("dl", r.status, str(r.body)[:200])
