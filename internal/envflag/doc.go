// Package envflag sets a command's flags from environment variables named
// after them (--max-services from VIPD_MAX_SERVICES), generically over a
// pflag.FlagSet, so that no flag needs code of its own. It owns only that
// mapping; the command line always wins over the environment.
package envflag
