"""A parameter-server job's script as a server runs it: init() serves until every trainer finished, then exits."""

import unison.ps as ps

ps.init()
raise SystemExit("unison.ps.init() returned on a server")
