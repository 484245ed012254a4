// Package lua holds pace's Redis scripts, one file each: common.lua, the
// prelude of every script, and the parts internal/store joins into the
// scripts it calls. Each script that decides reads Redis's clock (TIME)
// itself, and decides in one atomic call; release.lua, which decides
// nothing, runs without the prelude.
package lua

import "embed"

// FS holds the scripts, by file name.
//
//go:embed *.lua
var FS embed.FS
