/** How `kanal` parses flags (main.ts), shared with the kit's in-process launcher so both read flags alike. */
export const PARSER_CONFIGURATION = { 'camel-case-expansion': false, 'strip-aliased': true } as const;
