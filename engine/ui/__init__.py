"""The local web UI (`runstream ui`): the run list, run pages with a time-travel slider, and
the system page, server-rendered from the namespace's read model by aiohttp; a little
JavaScript (static/ui.js, no build step) moves the slider.

May import every library package (`engine.timetravel`, `engine.ops`, `engine.readmodel`,
`engine.flow`, ..., `projections`, `engine.journal.timetext`); only the CLI imports it.
"""

from runstream.engine.ui.app import UiSettings, create_app
from runstream.engine.ui.server import serve_ui

__all__ = ["UiSettings", "create_app", "serve_ui"]
