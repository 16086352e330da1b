import importlib.util, os, sys, traceback, subprocess
sys.path.insert(0, "tests/lib")
from linuxguest import LinuxStack, dump_logs
from tap import Tap
HERE = os.path.abspath("tests/linux")
spec = importlib.util.spec_from_file_location("linux_image", os.path.join(HERE, "linux-image.py"))
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
build, image = sys.argv[1], sys.argv[2]
t = Tap()
g = LinuxStack(t, os.getcwd(), os.path.abspath(build), image)
try:
    mod.images(t, g.fc, g.stack, os.path.abspath(build), image, g.state)
except Exception:
    t.ok(False, "ran", traceback.format_exc())
finally:
    if t.failed:
        dump_logs(t, g.state)
    g.down()
sys.exit(t.done())
