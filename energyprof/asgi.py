"""`energyprof.asgi.EnergyMiddleware`: each HTTP request of an ASGI application (FastAPI, Starlette) a
window of the profile that runs in process, named `GET /items/{item_id}` (docs/units.md).

    app.add_middleware(EnergyMiddleware)
    with energy_profile(json="p.json"):
        uvicorn.run(app)

Under `python -m energyprof` no middleware is needed: the servers are hooked as they are imported.
"""

from .integrations.requests import AsgiMiddleware as EnergyMiddleware

__all__ = ["EnergyMiddleware"]
