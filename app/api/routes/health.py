"""/health and /ready: the probes of a load balancer or an orchestrator."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.api.state import state_of
from app.core.db import ping
from app.core.errors import RETRY_AFTER

router = APIRouter(tags=["operations"])

READY_TIMEOUT = 1.5  # seconds each readiness probe may take


# On the event loop, never in the thread pool: it answers even when every pool
# thread waits on a database that does not answer.
@router.get("/health", summary="The process is up")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", summary="Database and broker reachable (else 503), answered within 2 s")
async def ready(request: Request) -> JSONResponse:
    def database() -> None:
        ping(state_of(request).engine)

    async def check(name: str, probe: Any) -> tuple[str, str]:
        # Own threads, so that a hung database cannot also hold up this answer.
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.run_in_executor(state_of(request).probes, probe),
                                   READY_TIMEOUT)
            return name, "ok"
        except TimeoutError:
            return name, f"not answering within {READY_TIMEOUT} s"
        except Exception as exc:
            return name, f"unreachable: {type(exc).__name__}"

    checks = dict(await asyncio.gather(check("database", database),
                                       check("broker", state_of(request).queue.ping)))
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse(status_code=200 if ok else 503,
                        headers=None if ok else {"Retry-After": str(RETRY_AFTER)},
                        content={"status": "ready" if ok else "not ready", **checks})
