"""Sets up a worker process from settings: its log format and level, and its Dramatiq
broker.  Import before declaring actors."""

from __future__ import annotations

import dramatiq

from shared.logs import configure_logging
from shared.queue import get_broker
from shared.settings import get_settings

configure_logging(get_settings().log_level)
broker = get_broker(get_settings().redis_url)
dramatiq.set_broker(broker)
