"""/console: the web console's static files (loraplex/console/static), same origin as the API.

The files hold no secret and need no token; every figure on the pages comes from the REST routes,
called by the browser with the token the user signed in with. The headers keep the pages from
loading anything but their own files (so nothing else on a page can read the token), from being
framed, and from sending the page's URL elsewhere."""

from __future__ import annotations

from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from loraplex.console import STATIC_DIR

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate: a new version of the console shows at the next load
}


class ConsoleFiles(StaticFiles):
    async def get_response(self, path, scope):
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def console_routes() -> list[Mount]:
    return [Mount("/console", app=ConsoleFiles(directory=STATIC_DIR, html=True), name="console")]
