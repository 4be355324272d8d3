"""Imported again and again by the threads of a worker's main process and by its children (the
fork-gate test, ``tests.support.fork_hazard``). Its body takes a while and logs, as a real module's
import does (soundfile's looks for its library), so a fork lands in the middle of it often."""

import logging
import time

logging.getLogger("tests.fork_hazard").info("importing %s", __name__)
time.sleep(0.002)
