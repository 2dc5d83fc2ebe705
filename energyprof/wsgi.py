"""`energyprof.wsgi.EnergyMiddleware`: each request of a WSGI application (Flask) a window of the profile
that runs in process, named `GET /items/<int:item_id>` from the URL rule (docs/units.md).

    app.wsgi_app = EnergyMiddleware(app.wsgi_app)

Under `python -m energyprof` no middleware is needed: wsgiref's and waitress's servers are hooked as
they are imported.
"""

from .integrations.requests import WsgiMiddleware as EnergyMiddleware

__all__ = ["EnergyMiddleware"]
