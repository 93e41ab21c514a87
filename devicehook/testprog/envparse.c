/*
 * Feeds the hook's environment parser from stdin, for `go test -fuzz`.
 * Input: records of  <u32 length><bytes>  (little endian); each record is
 * a NUL-separated environ block. Output per record, one line:
 *   mem=<limit dev0>,<limit dev1> sm=<sm dev0>,<sm dev1> reserve=<n> period=<ms> log=<l> disabled=<d>
 * (limits print "none" when unlimited), preceded by the parser's log lines
 * (stderr is merged into stdout so each record's logs come before its
 * result). Built with ASan/UBSan too.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/state.h"

int main(void)
{
	uint32_t len;
	dup2(1, 2);
	while (fread(&len, 4, 1, stdin) == 1) {
		char *buf = malloc((size_t)len + 2);
		if (len && fread(buf, 1, len, stdin) != len)
			return 1;
		buf[len] = '\0';
		buf[len + 1] = '\0';
		char *env[256];
		int n = 0;
		for (char *p = buf; p < buf + len && n < 255; p += strlen(p) + 1)
			env[n++] = p;
		env[n] = NULL;
		struct gp_config c;
		gp_config_from_env(&c, env);
		char m0[32], m1[32];
		if (c.mem_limit[0] == GP_UNLIMITED) strcpy(m0, "none"); else snprintf(m0, sizeof m0, "%llu", (unsigned long long)c.mem_limit[0]);
		if (c.mem_limit[1] == GP_UNLIMITED) strcpy(m1, "none"); else snprintf(m1, sizeof m1, "%llu", (unsigned long long)c.mem_limit[1]);
		printf("mem=%s,%s sm=%d,%d reserve=%llu period=%u log=%d disabled=%d\n", m0, m1, c.sm_limit[0], c.sm_limit[1],
		       (unsigned long long)c.ctx_reserve, c.sm_period_ms, c.log_level, c.disabled);
		fflush(stdout);
		free(buf);
	}
	return 0;
}
