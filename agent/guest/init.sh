# shellcheck shell=sh
# The guest init, pid 1 of a desktop (see agent/src/runtime/sandbox/guest-init.ts):
#   sh -c INIT canto-init <largest screen> <default screen> <framebuffer dir> <env-on-fd5 or -> <sealed /proc paths>...
# It reopens its stdio inside the guest (CRIU cannot dump an fd pointing at a host mount), writes
# the env file a first boot hands it on fd 5 (host/first-boot.ts writes the same file), starts
# Xvfb at the largest size and waits for it through -displayfd, shrinks the screen to the default
# size, starts openbox and waits until it manages the screen, reports `ready` on fd 4 and then only
# reaps orphans.
max_screen=$1 default_screen=$2 fb_dir=$3 env_fd=$4
shift 4
# The rest of the arguments are the parts of /proc the agent makes read-only before this runs
# (host/proc-seal.ts): root writes a sysctl by its mode alone. bwrap starts this even when the
# agent never said go (its block fd closed unwritten), so the guest goes no further unless each of
# them this kernel has is read-only; the last mount at a path is the one seen.
sealed=
for p; do [ -e "$p" ] && sealed="$sealed $p"; done
if ! unsealed=$(awk -v want="$sealed" '
  BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) ro[w[i]] = 0 }
  ($5 in ro) { split($6, o, ","); ro[$5] = (o[1] == "ro") }
  END { for (p in ro) if (!ro[p]) printf " %s", p }' /proc/self/mountinfo); then
  echo "cannot check that /proc is read-only" >&4; exit 1
fi
if [ -n "$unsealed" ]; then echo "writable:$unsealed" >&4; exit 1; fi
exec 3>&- </dev/null >/dev/null 2>&1
mkdir -p /var/log/canto /run/canto /run/lock /tmp/.X11-unix
chmod 1777 /tmp/.X11-unix /dev/shm
exec >>/var/log/canto/init.log 2>&1
echo "canto init: boot $(date -u +%FT%TZ)"
if [ "$env_fd" = env-on-fd5 ]; then
  if ! (umask 077 && mkdir -p /root/.canto && cat <&5 >/root/.canto/.env.tmp && chmod 600 /root/.canto/.env.tmp &&
    mv -f /root/.canto/.env.tmp /root/.canto/env); then
    echo "writing the env file failed" >&4; exit 1
  fi
  exec 5<&-
fi
rm -f /tmp/.X0-lock /tmp/.X11-unix/X0 /run/canto/xready
mkfifo /run/canto/xready
Xvfb :0 -screen 0 "$max_screen"x24 -noreset -extension GLX -nolisten tcp -fbdir "$fb_dir" -displayfd 5 5>/run/canto/xready 4>&- &
read -r display </run/canto/xready
rm -f /run/canto/xready
if [ -z "$display" ]; then echo "Xvfb failed" >&4; exit 1; fi
xrandr --output screen --off --fb "$default_screen" 4>&- || xrandr --fb "$default_screen" 4>&-
openbox 4>&- &
# Ready once the window manager is: a window mapped while openbox is still starting can stay
# unmapped for good. _NET_WORKAREA is among the last things it sets up. At most about 3 s. Openbox
# takes 50-150 ms here: a fine poll answers within 10 ms of it instead of up to 50.
i=0
until xprop -root _NET_WORKAREA 2>/dev/null | grep -q '='; do
  i=$((i + 1)); [ $i -ge 200 ] && { echo "openbox is slow to start"; break; }
  sleep 0.01
done
# From here on it only reaps orphans: a one-line shell does that, so `ps` in the guest shows
# pid 1 as that instead of this whole script. It reports ready itself, so nothing is dumped while
# the exec runs.
exec /bin/sh -c 'echo ready >&4; exec 4>&-; while :; do sleep 2147483647 & wait $!; done' canto-init
