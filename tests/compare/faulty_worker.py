"""Test seams for the runner: workers that misbehave on purpose. Never reachable from a user's flag."""
import os
import signal
import sys
import time

import numpy as np

from compare.engines import worker


def wrong_gradients(request, send):
    """The real handler, then a 1% error in the saved gradient: gradient_formula must fail."""
    answer = worker.gradients(request, send)
    path = os.path.join(request["out"], "gradients.npz")
    with np.load(path) as z:
        grads = {k: z[k] * 1.01 for k in z.files}
    np.savez(path, **grads)
    return answer


if __name__ == "__main__":
    if sys.argv[1:] == ["crash-on-torch"] and worker.ENGINE == "torch":
        print("RuntimeError: simulated crash while loading the engine", file=sys.stderr)
        sys.exit(1)
    if sys.argv[1:] == ["wrong-gradients"]:
        worker.HANDLERS["gradients"] = wrong_gradients
    if sys.argv[1:] == [f"killed-on-{worker.ENGINE}"]:
        worker.HANDLERS["gradients"] = lambda request, send: os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[1:] == ["chatty"]:
        print("an engine's banner, printed to stdout before the protocol starts", flush=True)
    if sys.argv[1:] == ["train-fails-on-torch"]:
        if worker.ENGINE == "torch":
            worker.HANDLERS["train"] = lambda request, send: 1 / 0
        gradients = worker.HANDLERS["gradients"]
        worker.HANDLERS["gradients"] = lambda request, send: print("gradients asked", file=sys.stderr) or gradients(
            request, send)
    if sys.argv[1:] == ["hang-on-jax"] and worker.ENGINE == "jax":
        worker.HANDLERS["cross_predict"] = lambda request, send: time.sleep(3600)  # a build_model never returning
    worker.main()
