"""Power loss for real broker processes (scripts/cluster_check.py --power-losses N /
--power-loss-all): each node's data directory is an ext4 file system of its own on a loop
device, and a power loss keeps of it only what had reached the device.

Why this is a power loss: a write(2) the broker has not fsynced sits in ext4's page cache
(dirty pages of the broker's files); it reaches the loop device only when ext4 writes it back
(its journal commit, every 5 s by default, or fsync). The loop device writes through to its
backing image file. So the image file at an instant holds everything fsynced before that
instant, plus some of what was not: a state a real disk can be in after the power went out.

The sequence (`power_loss`): SIGSTOP the nodes and wait until every one of their threads is
stopped (a thread inside fsync(2) finishes it first: an acknowledgement the node sent before
it stopped is for data already in the image), copy each image (sparse) as it is now, SIGKILL
the nodes, unmount, put the copies in place of the images, mount them again (ext4 replays its
journal) and restart the nodes. What the kernel wrote back between the copy and the unmount
is thrown away with the old image.

Needs root, losetup and mkfs.ext4 (CI runs as root).
"""

import os
import shutil
import subprocess
import time

# Each node's file system: sparse, so only what the broker writes takes space.
IMAGE_BYTES = 4 << 30
STOP_WAIT_S = 10.0


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def available():
    """Why power losses cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "power losses need root (loop devices and mounts)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if not shutil.which(tool):
            return f"power losses need {tool}"
    return None


class LoopDisk:
    """A node's data directory on an ext4 file system of its own, on a loop device."""

    def __init__(self, node):
        self.node = node
        self.image = os.path.join(node.dir, "disk.img")
        self.device = None

    def setup(self):
        with open(self.image, "wb") as f:
            f.truncate(IMAGE_BYTES)
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", self.image])
        self.attach()

    def attach(self):
        out = subprocess.run(["losetup", "-f", "--show", self.image], check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.device = out.stdout.strip()
        os.makedirs(self.node.data_dir, exist_ok=True)
        run(["mount", "-t", "ext4", self.device, self.node.data_dir])

    def detach(self):
        if self.device is None:
            return
        for _ in range(50):
            if subprocess.run(["umount", self.node.data_dir], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.1)
        else:
            run(["umount", "-l", self.node.data_dir])
        subprocess.run(["losetup", "-d", self.device], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        self.device = None

    def snapshot(self):
        """The image as it is now: what reached the device (sparse copy)."""
        snap = self.image + ".powerloss"
        run(["cp", "--sparse=always", self.image, snap])
        return snap

    def restore(self, snap):
        self.detach()
        os.replace(snap, self.image)
        self.attach()


def wait_stopped(pid, timeout_s=STOP_WAIT_S):
    """Waits until every thread of `pid` is stopped (state T), not merely signalled: a thread
    inside a system call (fsync) stops when it returns."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
                    # pid (comm) state ...: the comm may hold spaces; the state follows ')'.
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            return True  # gone
        if states and all(s in ("T", "t", "Z", "X") for s in states):
            return True
        time.sleep(0.01)
    return False


def power_loss(nodes, disks, restart):
    """Cuts the power of `nodes` (their disks keep what had reached them) and starts them
    again with `restart(node)`. Returns the seconds the nodes were down."""
    t0 = time.monotonic()
    live = [n for n in nodes if n.alive()]
    for n in live:
        n.pause()
    for n in live:
        if not wait_stopped(n.proc.pid):
            raise RuntimeError(f"{n.name} did not stop within {STOP_WAIT_S} s")
    snaps = {n.index: disks[n.index].snapshot() for n in nodes}
    for n in nodes:
        n.kill()
    for n in nodes:
        disks[n.index].restore(snaps[n.index])
    for n in nodes:
        restart(n)
    return time.monotonic() - t0


def teardown(disks):
    for d in disks.values():
        try:
            d.detach()
        except (OSError, subprocess.CalledProcessError):
            pass
