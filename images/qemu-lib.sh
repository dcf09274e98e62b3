# shellcheck shell=sh
# images/qemu-lib.sh: the installed QEMU as the lab runs it, for the
# scripts that carry it to a machine without it: build-nested-host.sh (into
# the nested mode's emulated host) and build-qemu-bundle.sh (into an image
# archive, for a host without Debian's packages). POSIX sh; sourced after
# lib.sh, never run. Each of those scripts hashes this file into its key
# (qemu_lib_inputs).
#
# The functions' own variables are named qlib_*.

QEMU_LIB="$HERE/qemu-lib.sh"

# What QEMU reads to boot a lab guest (blklab run's command line: a
# bzImage with -kernel on q35, -accel kvm or tcg, the default VGA, -nic
# none, memfd memory, vhost-user-blk-pci disks): SeaBIOS, the standard
# VGA's BIOS, the TPR-patching option ROM and the DMA Linux loader (strace
# -e openat of that command line). Nothing else: no NIC ROMs, no modules.
QEMU_FIRMWARE="bios-256k.bin vgabios-stdvga.bin kvmvapic.bin linuxboot_dma.bin"

# qemu_lib_inputs: the inputs-hash line of this file.
qemu_lib_inputs() { echo "qemu-lib $(sha256 "$QEMU_LIB")"; }

# qemu_identify QEMU: which QEMU it is, from the dpkg database (local):
# QBIN (its real path), QPKG and QPKGVER (the package that ships it and its
# version; both empty for a QEMU from no package) and QID ("PKG VERSION",
# else "sha256 SHA" of the binary). Dies when QEMU is not found.
# shellcheck disable=SC2034  # QPKGVER, QID: for the caller
qemu_identify() {
    command -v "$1" >/dev/null 2>&1 || die "$1 not found: apt-get install qemu-system-x86"
    QBIN=$(readlink -f "$(command -v "$1")")
    QPKG=$(dpkg-query -S "$QBIN" 2>/dev/null | head -n1 | cut -d: -f1 || true)
    if [ -n "$QPKG" ]; then
        QPKGVER=$(dpkg-query -W -f='${Version}' "$QPKG")
        QID="$QPKG $QPKGVER"
    else
        QPKGVER=""
        QID="sha256 $(sha256 "$QBIN")"
    fi
}

# qemu_firmware QEMU: FWPATHS, the path of each of QEMU_FIRMWARE where
# QEMU finds it (its -L help directories, in its order), space-separated;
# dies naming the one it finds nowhere.
qemu_firmware() {
    qlib_dirs=$("$1" -L help 2>/dev/null) || die "$1 -L help failed (is $1 a QEMU 5.0 or newer?)"
    FWPATHS=""
    for qlib_fw in $QEMU_FIRMWARE; do
        qlib_p=""
        for qlib_d in $qlib_dirs; do
            if [ -f "$qlib_d/$qlib_fw" ]; then
                qlib_p="$qlib_d/$qlib_fw"
                break
            fi
        done
        [ -n "$qlib_p" ] || die "$1 finds no $qlib_fw in $(echo "$qlib_dirs" | tr '\n' ' ')(apt-get install qemu-system-data seabios)"
        FWPATHS="$FWPATHS $qlib_p"
    done
    FWPATHS=${FWPATHS# }
}

# qemu_firmware_inputs: an inputs-hash line "firmware NAME SHA256" per
# file of FWPATHS.
qemu_firmware_inputs() {
    for qlib_p in $FWPATHS; do
        echo "firmware ${qlib_p##*/} $(sha256 "$qlib_p")"
    done
}

# firmware_json: FWPATHS as the items of a JSON list (path, the package
# that ships it, sha256), without the brackets.
firmware_json() {
    for qlib_p in $FWPATHS; do
        printf '{"path": "%s", "package": "%s", "sha256": "%s"}\n' "$(jstr "$qlib_p")" \
            "$(dpkg-query -S "$qlib_p" 2>/dev/null | head -n1 | cut -d: -f1)" "$(sha256 "$qlib_p")"
    done | awk '{ printf "%s%s", (n++ ? ", " : ""), $0 }'
}

# elf_libs BINARY...: "NAME PATH" for every library ldd lists for the
# BINARYs (NAME: the name a binary asks for, PATH: the file the host's
# loader maps for it), sorted by NAME, each NAME once; not the ELF
# interpreter. Dies when ldd fails, finds a library nowhere or lists a
# file that does not exist. Run it in $(…) under set -e.
elf_libs() {
    qlib_out=""
    for qlib_b in "$@"; do
        qlib_ldd=$(ldd "$qlib_b" 2>&1) || die "ldd $qlib_b failed (is it a dynamically linked ELF?): $qlib_ldd"
        case "$qlib_ldd" in
        *"not found"*) die "ldd $qlib_b: $(echo "$qlib_ldd" | grep 'not found' | head -n1 | tr -s ' \t' ' ')" ;;
        esac
        qlib_out="$qlib_out
$(echo "$qlib_ldd" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')"
    done
    qlib_out=$(echo "$qlib_out" | grep -v '^$' | LC_ALL=C sort -u -k1,1)
    [ -n "$qlib_out" ] || die "ldd $* listed no libraries"
    for qlib_p in $(echo "$qlib_out" | cut -d' ' -f2); do
        [ -e "$qlib_p" ] || die "library $qlib_p (from ldd) does not exist"
    done
    echo "$qlib_out"
}

# elf_interp BINARY: the ELF interpreter BINARY names (its PT_INTERP).
elf_interp() {
    qlib_i=$(LC_ALL=C readelf -l "$1" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
    [ -n "$qlib_i" ] || die "$1 names no ELF interpreter"
    echo "$qlib_i"
}
