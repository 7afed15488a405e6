package envflag

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// Name is the environment variable of flag under prefix: the prefix, an
// underscore, and the flag's name in upper case with dashes as
// underscores (Name("VIPD", "max-services") is "VIPD_MAX_SERVICES").
func Name(prefix, flag string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Apply sets every flag of fs that the command line did not set
// (pflag.Flag.Changed is false) from its variable (see Name), when lookup
// finds one; lookup is os.LookupEnv outside tests. The value is parsed as
// the flag parses it, so a slice flag takes comma-separated values. The
// help and version flags are left alone. The first value that does not
// parse is an error naming the variable and its flag; Apply then returns
// without setting the remaining flags.
func Apply(fs *pflag.FlagSet, prefix string, lookup func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" || f.Name == "version" {
			return
		}
		name := Name(prefix, f.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("environment variable %s=%q (--%s): %w", name, v, f.Name, serr)
		}
	})
	return err
}
