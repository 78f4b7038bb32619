"""Sets this process's Dramatiq broker from settings; import before declaring actors."""

from __future__ import annotations

import dramatiq

from shared.queue import get_broker
from shared.settings import get_settings

broker = get_broker(get_settings().redis_url)
dramatiq.set_broker(broker)
