// Package configfile sets a command's flags from a YAML file whose keys are
// the flags' names (max-services: 1000; a slice flag takes a YAML list),
// generically over a pflag.FlagSet, so that no flag needs code of its own.
// It owns only that mapping: it never overrides a flag that is already set
// (by the command line or the environment, see internal/envflag), and it
// refuses keys that name no flag.
package configfile
