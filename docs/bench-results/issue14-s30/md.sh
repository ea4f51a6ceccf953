set -e
# md.sh: mdtest-like phases (mdph.py: 2 threads x N files of 32 KiB, create/stat/read/remove) on one mount
# (MODE=none: uncached with a cache dir, rw or ro: a rule on the root's project; WROOT: where), with the
# daemon's time per opcode for each phase (from its metrics on 127.0.0.1:9596)
BIN=${BIN:-/work/rel29/release/tierfs}
MODE=${MODE:-rw}
W=$(mktemp -d ${WROOT:-/var/tmp}/md.XXXX)
trap 'cd /; $BIN umount $W/mnt 2>/dev/null; rm -rf $W' EXIT
mkdir $W/mnt $W/cache
$BIN format --meta sqlite://$W/meta.db --target file://$W/ost0 >/dev/null
[ $MODE = rw ] && $BIN pcc rule add --meta sqlite://$W/meta.db --mode rw 'projid={4701}' >/dev/null
[ $MODE = ro ] && $BIN pcc rule add --meta sqlite://$W/meta.db --mode ro 'projid={4701}' >/dev/null
$BIN mount --meta sqlite://$W/meta.db $W/mnt --client-name rwd --log-file $W/log --cache-dir $W/cache --cache-size 16G --metrics 127.0.0.1:9596 $EXTRA
$BIN project -s -p 4701 $W/mnt >/dev/null
sleep 2
python3 "$(dirname "$0")"/mdph.py $W/mnt/md ${N:-2000}
