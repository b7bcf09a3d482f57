"""``b2bgw serve`` that dies by SIGKILL right after an AS2 message's document is committed and before its MDN
is kept or sent (test_crash.py): the worst moment for a partner's resend."""

import os
import signal
import sys

from gateway.as2 import store


async def _die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


store.As2Store.record_received = _die

from gateway.cli.main import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
