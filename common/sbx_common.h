/*  sbx_common - the public API of the common library, one include for every process. */
#ifndef SBX_COMMON_H_INCLUDED
#define SBX_COMMON_H_INCLUDED

#include <czmq.h>

#include "sbx_clock.h"
#include "sbx_config.h"
#include "sbx_curve.h"
#include "sbx_daemon.h"
#include "sbx_idmap.h"
#include "sbx_log.h"
#include "sbx_msg.h"
#include "sbx_peer.h"
#include "sbx_ready.h"
#include "sbx_secret.h"
#include "sbx_tapreader.h"

#endif
