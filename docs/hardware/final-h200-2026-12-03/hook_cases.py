"""Feed the installed apt hook (protocol 3) a few moves under the frozen policy: each should be refused but the
unrelated one."""
import subprocess

inst = {}
out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${Architecture} ${db:Status-Abbrev}\n"],
                     capture_output=True, text=True).stdout
for row in out.splitlines():
    p = row.split()
    if len(p) >= 4 and p[3].startswith("ii"):
        inst[p[0]] = (p[1], p[2])
head = "VERSION 3\nAPT::Architecture=amd64\nCommandLine::AsString=apt-get%20install\n\n"


def line(name, old, new, arch="amd64"):
    return f"{name} {old} {arch} none < {new} {arch} none /var/cache/apt/archives/{name}_{new}_{arch}.deb"


cases = {}
cudart = sorted(n for n in inst if n.startswith("cuda-cudart-13-0"))
if cudart:
    n = cudart[0]
    old = inst[n][0]
    cases[f"{n} to another build"] = head + line(n, old, old.split("-")[0] + "-99") + "\n"
cases["cuda-toolkit-13-1 beside 13.0"] = head + ("cuda-toolkit-13-1 - - none < 13.1.0-1 amd64 none "
                                                  "/var/cache/apt/archives/cuda-toolkit-13-1_13.1.0-1_amd64.deb\n")
cases["nvidia-driver-590-open installed"] = head + ("nvidia-driver-590-open - - none < 590.44.01-0ubuntu1 amd64 none "
                                                     "/x/nvidia-driver-590-open.deb\n")
cases["linux-image-6.99.0-1-generic installed"] = head + ("linux-image-6.99.0-1-generic - - none < 6.99.0-1.1 amd64 "
                                                           "none /x/linux-image.deb\n")
cases["an unrelated package (vim-tiny)"] = head + "vim-tiny - - none < 2:9.1.0016-1ubuntu7 amd64 none /x/vim-tiny.deb\n"
for label, text in cases.items():
    r = subprocess.run(["/usr/lib/gpuguard/gpuguard-apt-hook"], input=text, capture_output=True, text=True,
                       env={"APT_HOOK_INFO_FD": "0", "PATH": "/usr/bin:/bin"})
    print(f"== {label}: exit {r.returncode}\n   {text.splitlines()[-1]}\n{r.stderr.strip()[:1500]}")
