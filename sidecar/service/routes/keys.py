"""The application's state, one typed aiohttp ``AppKey`` each (set once, in ``make_app``)."""

from __future__ import annotations

from aiohttp import web

from ..jobs.captures import CaptureManager
from ..jobs.board import JobBoard
from ..jobs.modules import ModuleManager
from ..jobs.memory import MemoryManager
from ..channel.queries import QueryBroker
from ..channel.registry import ProbeRegistry
from ..jobs.request_captures import RequestCaptures
from ..jobs.scans import ScanManager
from .settings import ServiceSettings
from ..incidents.triggers import Triggers
from ..jobs.storing import JobStore

SETTINGS = web.AppKey("settings", ServiceSettings)
REGISTRY = web.AppKey("registry", ProbeRegistry)
JOBS = web.AppKey("jobs", JobBoard)
CAPTURES = web.AppKey("captures", CaptureManager)
SCANS = web.AppKey("scans", ScanManager)
MODULES = web.AppKey("modules", ModuleManager)
MEMORY = web.AppKey("memory", MemoryManager)
QUERIES = web.AppKey("queries", QueryBroker)
TRIGGERS = web.AppKey("triggers", Triggers)
REQUEST_CAPTURES = web.AppKey("request_captures", RequestCaptures)
STORE = web.AppKey("store", JobStore)  # set only with sidecar serve --store
