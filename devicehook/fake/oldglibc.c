/* A glibc older than 2.34, as far as the hook can tell (issue 15 item 7):
 * dlsym has no GLIBC_2.34 version there, only the architecture's base one
 * (GLIBC_2.17 on aarch64, GLIBC_2.2.5 on x86_64). Preloaded before the
 * hook, this dlvsym answers NULL for dlsym@GLIBC_2.34 and forwards every
 * other look-up to glibc's. It cannot ask for glibc's dlvsym by name: any
 * dlsym it calls is the hook's (not ready while the hook's constructor
 * asks for the real one), and a reference of its own to dlvsym binds to
 * itself. So it finds glibc's in libc's dynamic symbol table. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>

typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static int find(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	if (info->dlpi_name == NULL || strstr(info->dlpi_name, "/libc.so.6") == NULL)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type != PT_DYNAMIC)
			continue;
		ElfW(Dyn) *d = (ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
		ElfW(Sym) *sym = NULL;
		const char *str = NULL;
		ElfW(Half) *ver = NULL;
		for (; d->d_tag != DT_NULL; d++) {
			/* glibc has relocated these to addresses already */
			if (d->d_tag == DT_SYMTAB)
				sym = (ElfW(Sym) *)d->d_un.d_ptr;
			else if (d->d_tag == DT_STRTAB)
				str = (const char *)d->d_un.d_ptr;
			else if (d->d_tag == DT_VERSYM)
				ver = (ElfW(Half) *)d->d_un.d_ptr;
		}
		if (sym == NULL || str == NULL || (const char *)sym >= str)
			return 0;
		/* .dynstr follows .dynsym in glibc's libc: the count */
		size_t n = (size_t)((const char *)str - (const char *)sym) / sizeof *sym;
		for (size_t k = 0; k < n; k++)
			if (sym[k].st_value != 0 && !strcmp(str + sym[k].st_name, "dlvsym") &&
			    (ver == NULL || !(ver[k] & 0x8000))) {
				*(dlvsym_fn *)data = (dlvsym_fn)(info->dlpi_addr + sym[k].st_value);
				return 1;
			}
	}
	return 0;
}

void *dlvsym(void *handle, const char *symbol, const char *version)
{
	static dlvsym_fn real;
	if (real == NULL)
		dl_iterate_phdr(find, &real);
	if (real == NULL)
		return NULL;
	if (!strcmp(symbol, "dlsym") && !strcmp(version, "GLIBC_2.34"))
		return NULL;
	/* The hook's RTLD_NEXT means the objects after it, where dlsym is
	 * libc's; from here RTLD_NEXT would start at the hook itself. */
	if (handle == RTLD_NEXT) {
		void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
		return libc ? real(libc, symbol, version) : NULL;
	}
	return real(handle, symbol, version);
}
