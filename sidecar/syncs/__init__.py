"""Hidden-sync detector: which lines of an engine's step make the host wait for the device.

``SyncScan`` (scan.py) scans N working steps with the probe's step interface; ``SyncDetector``
(detector.py) does the catching; report.py holds the per-site report, baseline comparison and the
merge across processes; allowlist.py says which sites are expected. See docs/syncs.md.
"""

from .allowlist import EXPECTED, HIDDEN, AllowEntry, Allowlist, from_environment, load_entries
from .detector import SyncDetector
from .report import build_sites, merge_reports, new_sites
from .scan import SyncScan, SyncSpec
from .settings import ENV_ALLOWLIST, ENV_TREAT_CPU_AS_DEVICE
from .sites import PhaseRule, SiteLocator

__all__ = [
    "AllowEntry", "Allowlist", "ENV_ALLOWLIST", "ENV_TREAT_CPU_AS_DEVICE", "EXPECTED", "HIDDEN",
    "PhaseRule", "SiteLocator", "SyncDetector", "SyncScan", "SyncSpec", "build_sites", "from_environment", "load_entries",
    "merge_reports", "new_sites",
]
