"""The application's state, one typed aiohttp ``AppKey`` each (set once, in ``make_app``)."""

from __future__ import annotations

from aiohttp import web

from .captures import CaptureManager
from .job_board import JobBoard
from .module_jobs import ModuleManager
from .queries import QueryBroker
from .registry import ProbeRegistry
from .scans import ScanManager
from .settings import ServiceSettings
from .triggers import Triggers

SETTINGS = web.AppKey("settings", ServiceSettings)
REGISTRY = web.AppKey("registry", ProbeRegistry)
JOBS = web.AppKey("jobs", JobBoard)
CAPTURES = web.AppKey("captures", CaptureManager)
SCANS = web.AppKey("scans", ScanManager)
MODULES = web.AppKey("modules", ModuleManager)
QUERIES = web.AppKey("queries", QueryBroker)
TRIGGERS = web.AppKey("triggers", Triggers)
