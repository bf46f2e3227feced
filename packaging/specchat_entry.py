"""Entry point of the bundle: the same `specchat` command line, frozen."""
import os
import sys

from app.cli import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["--engine-worker"]:  # the app's engine worker (app/chat/worker/child.py: command)
        from app.chat.worker.child import main as worker

        sys.exit(worker(int(sys.argv[2])))
    # PyInstaller's bootloader points LD_LIBRARY_PATH into the bundle (keeping the user's value in
    # LD_LIBRARY_PATH_ORIG). This process has already loaded what it needs; give the programs it starts (the
    # browser, via xdg-open) the user's value back, so they load their own libraries rather than ours.
    if sys.platform.startswith("linux") and getattr(sys, "frozen", False):
        original = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
        if original is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = original
    sys.exit(main())
