# Sourced by hack/build-tools.sh and hack/build-install-tools.sh: build one
# pinned tool from its build module under hack/tools into $OUT, unless the
# pinned version is already there. Needs ROOT and OUT set.
#
# build_tool LOG_PREFIX NAME VERSION MODULE_DIR PACKAGE [LDFLAGS]
build_tool() {
	local prefix=$1 name=$2 version=$3 dir=$4 pkg=$5 ldflags=${6:-}
	local stamp="$OUT/.$name.version"
	if [[ -x "$OUT/$name" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
		return 0
	fi
	echo "$prefix: building $name $version" >&2
	local start=$SECONDS
	(cd "$ROOT/hack/tools/$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$OUT/$name.tmp.$$" "$pkg")
	mv -f "$OUT/$name.tmp.$$" "$OUT/$name"
	echo "$version" >"$stamp"
	echo "$prefix: built $name in $((SECONDS - start))s" >&2
}
