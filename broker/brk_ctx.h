/*  brk_ctx - what the broker's request handlers share. Owned by brk_server. */
#ifndef BRK_CTX_H_INCLUDED
#define BRK_CTX_H_INCLUDED

#include "brk_events.h"
#include "brk_store.h"
#include "sbx_common.h"

typedef struct {
    sbx_config_t *config;
    brk_store_t *store;
    brk_events_t *events;
} brk_ctx_t;

#endif
