#!/usr/bin/env bash
# Renders the missing fixtures/reference/*.wav with espeak-ng + sox (apt-get install espeak-ng sox); --all renders
# every clip again. Re-rendered clips differ in their bytes (sox dithers the clips made before -D was added here):
# re-record the goldens after (fastpath-suite maintain goldens --record --replace, per omnivoice version).
set -euo pipefail
cd "$(dirname "$0")/../fixtures/reference"
all=0; [ "${1:-}" = "--all" ] && all=1
tmp=$(mktemp -d)
render() {  # name rate [like]: 24 kHz 16-bit mono; with `like`, padded or cut at its end to that clip's sample count
  [ "$all" = 1 ] || [ ! -f "$1.wav" ] || return 0
  espeak-ng -v en-us -s "$2" -w "$tmp/$1.wav" "$(cat "$1.txt")"
  if [ -n "${3:-}" ]; then
    sox -D "$tmp/$1.wav" -r 24000 -b 16 "$tmp/$1-24k.wav"
    want=$(soxi -s "$3.wav"); have=$(soxi -s "$tmp/$1-24k.wav")
    if [ "$have" -ge "$want" ]; then sox "$tmp/$1-24k.wav" "$1.wav" trim 0 "${want}s"
    else sox "$tmp/$1-24k.wav" "$1.wav" pad 0 "$((want - have))s"; fi
  else
    sox "$tmp/$1.wav" -r 24000 -b 16 "$1.wav"
  fi
  echo "$1.wav: $(soxi -D "$1.wav") s, $(soxi -s "$1.wav") samples"
}
render ref_3s 145
render ref_6s 150
render ref_3s_b 170 ref_3s  # another sentence in the same number of samples as ref_3s: voices of equal length
rm -rf "$tmp"
